//! `server.request_buffering`: defaulted, switched off, and refused where
//! it could hold no body.

use std::path::Path;

use super::*;

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse(Path::new("test.yaml"), text)
}

#[test]
fn request_buffering_defaults_switches_off_and_holds_one_body_at_least() {
    let load = |buffering: &str| {
        parse(&format!(
            "version: 1\nserver: {{ listen: 127.0.0.1:0{buffering} }}\nupstream: {{ url: http://127.0.0.1:1 }}\n"
        ))
    };
    let c = load("").expect("valid");
    assert_eq!(
        c.live.server.request_buffering,
        RequestBuffering {
            max_body: 65_536,
            total: 4_194_304
        }
    );
    let c = load(", request_buffering: { max_body: 0 }").expect("valid");
    assert!(!c.live.server.request_buffering.is_on());
    for (buffering, message) in [
        (
            ", request_buffering: { max_body: 65536, total: 1000 }",
            "server.request_buffering.total: 1000 is below max_body (65536)",
        ),
        (
            ", request_buffering: { max_body: 2000000000 }",
            "server.request_buffering.max_body: must be at most 1073741824",
        ),
        (", request_buffering: { max: 1 }", "max"),
    ] {
        let errors = load(buffering).expect_err(buffering).to_string();
        assert!(errors.contains(message), "{buffering}: {errors}");
    }
}
