//! The configuration loader: any text → a `Config` or errors, never a
//! panic; every error names the file and a line, and says something.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sluice::config::Config;

fuzz_target!(|data: &[u8]| {
    // The loader is given text (`read_to_string` refuses invalid UTF-8
    // before it), so only text is worth the fuzzer's time.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.yaml");
    // `${NAME}` resolves to a fixed value for names starting with `SET`
    // and is unset otherwise: both paths are explored, reproducibly.
    let lookup = |name: &str| {
        if name.starts_with("SET") {
            Ok("value".to_owned())
        } else {
            Err(std::env::VarError::NotPresent)
        }
    };
    match Config::parse_with_env(path, text, &lookup) {
        Ok(config) => {
            let _ = config.route_table();
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "an empty error list");
            for e in &errors {
                assert_eq!(e.file, path, "{e}");
                assert!(e.line >= 1, "an error without a line: {e}");
                assert!(e.column >= 1, "an error without a column: {e}");
                assert!(
                    !e.message.trim().is_empty(),
                    "an error without a message: {e}"
                );
                let shown = e.to_string();
                assert!(
                    shown.starts_with(&format!("fuzz.yaml:{}:{}:", e.line, e.column)),
                    "{shown}"
                );
            }
        }
    }
});
