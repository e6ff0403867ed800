//! Names sluice takes (letters, digits, `_`, `-`, `.`; at most 64
//! characters), made from Kubernetes names and kept unique.

use std::collections::HashSet;

const MAX: usize = 64;

/// Hands out names, each used once.
#[derive(Debug, Default)]
pub struct Names {
    used: HashSet<String>,
}

impl Names {
    /// `base` made valid, with `-2`, `-3`… when it is taken.
    pub fn unique(&mut self, base: &str) -> String {
        let clean: String = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let clean = if clean.is_empty() {
            "ingress".to_owned()
        } else {
            clean
        };
        let mut n = 1;
        loop {
            let suffix = if n == 1 {
                String::new()
            } else {
                format!("-{n}")
            };
            let room = MAX - suffix.len();
            let head: String = clean.chars().take(room).collect();
            let name = format!("{head}{suffix}");
            if self.used.insert(name.clone()) {
                return name;
            }
            n += 1;
        }
    }
}
