//! `sluice check-manifests` through the built binary: a rendering with
//! sluice in front of every Service port exits 0 and says what it found;
//! one where a label came after the patch exits 2 naming the workload;
//! standard input is read with `-`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/manifests")
        .join(name)
}

fn check_manifests(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check-manifests")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice starts");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("stdin written");
    }
    drop(input);
    child.wait_with_output().expect("sluice exits")
}

#[test]
fn check_manifests_passes_a_sidecar_in_front_and_refuses_a_late_label() {
    let good = fixture("sidecar_added.yaml");
    let out = check_manifests(&[good.to_str().unwrap()], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Service/shop: port http (80) reaches sluice in Deployment/shop"),
        "{stdout}"
    );
    assert!(stdout.ends_with("0 errors, 0 warnings\n"), "{stdout}");

    let late = std::fs::read_to_string(fixture("label_from_overlay.yaml")).unwrap();
    let out = check_manifests(&["-"], Some(&late));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains("error    Deployment/billing (standard input, document 3): labelled sluice/sidecar: enabled but runs no `sluice` container"),
        "{stdout}"
    );

    // Objects from several files are checked together.
    let out = check_manifests(
        &[
            fixture("metrics_port_first.yaml").to_str().unwrap(),
            good.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("port http (80) reaches container `billing` on port 8000"));

    // Not YAML: exit 2 with the place.
    let out = check_manifests(&["-"], Some("kind: Service\nspec: [\n"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("standard input, document 1: "));
}
