use std::io::Write;

use super::*;

/// A fresh self-signed certificate for `localhost` and its key, as PEM.
fn self_signed() -> (String, String) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    (certified.cert.pem(), certified.key_pair.serialize_pem())
}

fn file(content: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(content.as_bytes()).unwrap();
    f
}

fn tls(cert: &Path, key: &Path) -> config::Tls {
    config::Tls {
        cert: cert.to_owned(),
        key: key.to_owned(),
    }
}

fn error(cert: &Path, key: &Path) -> TlsError {
    match acceptor(&tls(cert, key)) {
        Ok(_) => panic!("{} / {} were accepted", cert.display(), key.display()),
        Err(e) => e,
    }
}

#[test]
fn a_valid_pair_builds_an_acceptor_offering_h2_then_http11() {
    let (cert, key) = self_signed();
    let (cert, key) = (file(&cert), file(&key));
    let acceptor = acceptor(&tls(cert.path(), key.path())).unwrap();
    assert_eq!(
        acceptor.config().alpn_protocols,
        [b"h2".to_vec(), b"http/1.1".to_vec()]
    );
}

#[test]
fn each_broken_file_is_named() {
    let (cert_pem, key_pem) = self_signed();
    let (cert, key, empty) = (file(&cert_pem), file(&key_pem), file(""));
    let missing = Path::new("/nonexistent/sluice/tls.crt");

    let err = error(missing, key.path());
    assert!(matches!(err, TlsError::Read { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/sluice/tls.crt"));

    let err = error(empty.path(), key.path());
    assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");

    // A certificate where the key should be: no key in it.
    let err = error(cert.path(), cert.path());
    assert!(matches!(err, TlsError::NoKey { .. }), "{err}");

    let broken =
        file("-----BEGIN PRIVATE KEY-----\nnot base64 at all!\n-----END PRIVATE KEY-----\n");
    let err = error(cert.path(), broken.path());
    assert!(matches!(err, TlsError::BadKey { .. }), "{err}");
    assert!(!err.to_string().contains("base64 at all"));

    // A key that does not belong to the certificate.
    let (_, other_key) = self_signed();
    let other_key = file(&other_key);
    let err = error(cert.path(), other_key.path());
    assert!(matches!(err, TlsError::Unusable(_)), "{err}");
}
