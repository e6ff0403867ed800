//! Key paths (`routes[1].policy`) and where they are in the file.
//!
//! serde_yaml's `Value` forgets positions, so one pass of yaml-rust2's marked
//! event parser records the position of every key and value by path. An
//! error found later on a path is then placed without re-reading the file.

use std::collections::{HashMap, HashSet};
use std::fmt;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// A path from the document root to one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct KeyPath(Vec<Step>);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Step {
    Key(String),
    Index(usize),
}

impl KeyPath {
    pub fn root() -> KeyPath {
        KeyPath::default()
    }

    pub fn key(&self, key: &str) -> KeyPath {
        let mut steps = self.0.clone();
        steps.push(Step::Key(key.to_owned()));
        KeyPath(steps)
    }

    pub fn index(&self, index: usize) -> KeyPath {
        let mut steps = self.0.clone();
        steps.push(Step::Index(index));
        KeyPath(steps)
    }

    pub fn parent(&self) -> Option<KeyPath> {
        let (_, init) = self.0.split_last()?;
        Some(KeyPath(init.to_vec()))
    }

    /// True if `self` is `other` or lies inside it.
    pub fn starts_with(&self, other: &KeyPath) -> bool {
        self.0.starts_with(&other.0)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            match step {
                Step::Key(k) if i == 0 => f.write_str(k)?,
                Step::Key(k) => write!(f, ".{k}")?,
                Step::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

impl Pos {
    const START: Pos = Pos { line: 1, column: 1 };

    fn from_marker(m: Marker) -> Pos {
        // yaml-rust2 counts lines from 1 and columns from 0.
        Pos {
            line: m.line(),
            column: m.col() + 1,
        }
    }
}

/// Which end of a `key: value` pair an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The key itself (unknown, duplicated, not allowed here).
    Key,
    /// The value (wrong type, out of range, ...).
    Value,
}

#[derive(Debug, Clone, Copy)]
struct Spot {
    key: Option<Pos>,
    value: Pos,
    /// For ordering two candidate starts of one node.
    value_index: usize,
}

/// Positions of every node of one document, by key path.
#[derive(Debug, Default)]
pub struct Locations {
    spots: HashMap<KeyPath, Spot>,
}

/// A problem found while reading the YAML itself.
#[derive(Debug)]
pub struct SyntaxError {
    pub pos: Pos,
    /// Empty unless the problem is tied to a key (a duplicate).
    pub path: KeyPath,
    pub message: String,
}

impl Locations {
    /// Reads `text` once. Fails on a YAML syntax error or on duplicate keys
    /// (which serde_yaml would otherwise place at the enclosing mapping).
    pub fn build(text: &str) -> Result<Locations, Vec<SyntaxError>> {
        let mut recorder = Recorder::default();
        let mut parser = Parser::new_from_str(text);
        if let Err(e) = parser.load(&mut recorder, false) {
            return Err(vec![SyntaxError {
                pos: Pos::from_marker(*e.marker()),
                path: KeyPath::root(),
                message: e.info().to_owned(),
            }]);
        }
        if recorder.duplicates.is_empty() {
            Ok(Locations {
                spots: recorder.spots,
            })
        } else {
            Err(recorder.duplicates)
        }
    }

    /// Where an error about `path` should point. A path that is not in the
    /// file (a missing key, a node reached through an alias) points at the
    /// nearest enclosing node that is.
    pub fn find(&self, path: &KeyPath, at: At) -> Pos {
        if let Some(spot) = self.spots.get(path) {
            return match (at, spot.key) {
                (At::Key, Some(key)) => key,
                _ => spot.value,
            };
        }
        match path.parent() {
            Some(parent) => self.find(&parent, At::Value),
            None => Pos::START,
        }
    }
}

enum Frame {
    Mapping {
        path: KeyPath,
        /// The key whose value comes next; `None` while a key is expected.
        key: Option<String>,
        seen: HashSet<String>,
    },
    Sequence {
        path: KeyPath,
        next: usize,
    },
}

#[derive(Default)]
struct Recorder {
    stack: Vec<Frame>,
    spots: HashMap<KeyPath, Spot>,
    duplicates: Vec<SyntaxError>,
}

impl Recorder {
    /// The path of a node starting now, or `None` if it is a mapping key.
    fn node_path(&self) -> Option<KeyPath> {
        match self.stack.last() {
            None => Some(KeyPath::root()),
            Some(Frame::Mapping { key: None, .. }) => None,
            Some(Frame::Mapping {
                path, key: Some(k), ..
            }) => Some(path.key(k)),
            Some(Frame::Sequence { path, next }) => Some(path.index(*next)),
        }
    }

    fn record_value(&mut self, path: &KeyPath, mark: Marker) {
        let spot = self.spots.entry(path.clone()).or_insert(Spot {
            key: None,
            value: Pos::from_marker(mark),
            value_index: mark.index(),
        });
        spot.value = Pos::from_marker(mark);
        spot.value_index = mark.index();
    }

    fn key_scalar(&mut self, text: String, mark: Marker) {
        let Some(Frame::Mapping { path, key, seen }) = self.stack.last_mut() else {
            return;
        };
        let at = path.key(&text);
        if !seen.insert(text.clone()) {
            self.duplicates.push(SyntaxError {
                pos: Pos::from_marker(mark),
                path: at.clone(),
                message: format!("duplicate key `{text}`"),
            });
        }
        *key = Some(text);
        let pos = Pos::from_marker(mark);
        self.spots.insert(
            at.clone(),
            Spot {
                key: Some(pos),
                value: pos,
                value_index: mark.index(),
            },
        );
        // A block mapping's start event is marked at its first `:`, after
        // the first key: the mapping starts where that key does.
        if let Some(parent) = at.parent() {
            if let Some(spot) = self.spots.get_mut(&parent) {
                if mark.index() < spot.value_index {
                    spot.value = pos;
                    spot.value_index = mark.index();
                }
            }
        }
    }

    /// A value node has ended: the enclosing collection moves on.
    fn value_done(&mut self) {
        match self.stack.last_mut() {
            Some(Frame::Mapping { key, .. }) => *key = None,
            Some(Frame::Sequence { next, .. }) => *next += 1,
            None => {}
        }
    }

    /// Complex keys (a mapping or sequence used as a key) are legal YAML but
    /// meaningless here; they are recorded under a placeholder key.
    fn collection_path(&mut self) -> KeyPath {
        match self.node_path() {
            Some(path) => path,
            None => {
                if let Some(Frame::Mapping { path, key, .. }) = self.stack.last_mut() {
                    *key = Some("?".to_owned());
                    path.key("?")
                } else {
                    KeyPath::root()
                }
            }
        }
    }
}

impl MarkedEventReceiver for Recorder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(text, ..) => match self.node_path() {
                None => self.key_scalar(text, mark),
                Some(path) => {
                    self.record_value(&path, mark);
                    self.value_done();
                }
            },
            Event::Alias(_) => {
                if let Some(path) = self.node_path() {
                    self.record_value(&path, mark);
                    self.value_done();
                }
            }
            Event::MappingStart(..) => {
                let path = self.collection_path();
                self.record_value(&path, mark);
                self.stack.push(Frame::Mapping {
                    path,
                    key: None,
                    seen: HashSet::new(),
                });
            }
            Event::SequenceStart(..) => {
                let path = self.collection_path();
                self.record_value(&path, mark);
                self.stack.push(Frame::Sequence { path, next: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.value_done();
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(line: usize, column: usize) -> Pos {
        Pos { line, column }
    }

    #[test]
    fn keys_and_values_of_block_and_flow_nodes() {
        let text = "\
server:
  listen: 0.0.0.0:8080
routes:
  - name: a
    match: { methods: [GET, POST], path: /x }
  - name: b
";
        let l = Locations::build(text).expect("valid yaml");
        let routes = KeyPath::root().key("routes");
        assert_eq!(
            l.find(&KeyPath::root().key("server").key("listen"), At::Key),
            pos(2, 3)
        );
        assert_eq!(
            l.find(&KeyPath::root().key("server").key("listen"), At::Value),
            pos(2, 11)
        );
        // A block mapping starts at its first key, not at its first `:`.
        assert_eq!(l.find(&routes.index(0), At::Value), pos(4, 5));
        assert_eq!(l.find(&routes.index(1).key("name"), At::Value), pos(6, 11));
        let methods = routes.index(0).key("match").key("methods");
        assert_eq!(l.find(&methods.index(1), At::Value), pos(5, 29));
        assert_eq!(l.find(&routes.index(0).key("match"), At::Value), pos(5, 12));
        assert_eq!(
            l.find(&routes.index(0).key("match").key("path"), At::Key),
            pos(5, 36)
        );
    }

    #[test]
    fn a_missing_key_points_at_its_parent() {
        let l = Locations::build("a: 1\nserver:\n  admin: x\n").expect("valid yaml");
        let listen = KeyPath::root().key("server").key("listen");
        assert_eq!(l.find(&listen, At::Key), pos(3, 3));
        assert_eq!(
            l.find(&KeyPath::root().key("nope").key("deeper"), At::Key),
            pos(1, 1)
        );
    }

    #[test]
    fn duplicate_keys_are_reported_where_they_repeat() {
        let errors = Locations::build("a: 1\nb:\n  c: 1\n  c: 2\n").expect_err("duplicate");
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].pos, pos(4, 3));
        assert_eq!(errors[0].path.to_string(), "b.c");
    }

    #[test]
    fn syntax_errors_carry_a_position() {
        let errors = Locations::build("a: 1\n b: [\n").expect_err("bad yaml");
        assert_eq!(errors[0].pos.line, 2);
    }

    #[test]
    fn paths_display_like_the_yaml() {
        let p = KeyPath::root().key("routes").index(1).key("policy");
        assert_eq!(p.to_string(), "routes[1].policy");
        assert!(p.starts_with(&KeyPath::root().key("routes").index(1)));
        assert!(!p.starts_with(&KeyPath::root().key("routes").index(0)));
    }
}
