//! A self-signed `localhost` certificate for sluice's `server.tls`, its
//! files, and a client that trusts only it.

use std::io::Write as _;
use std::sync::Arc;

use tempfile::NamedTempFile;
use tokio_rustls::TlsConnector;

pub struct SelfSigned {
    /// PEM files, removed when this is dropped.
    pub cert: NamedTempFile,
    pub key: NamedTempFile,
    /// A client trusting this certificate alone, offering `alpn`.
    pub connector: TlsConnector,
}

pub fn self_signed(alpn: &[&[u8]]) -> SelfSigned {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let mut cert = NamedTempFile::new().unwrap();
    cert.write_all(certified.cert.pem().as_bytes()).unwrap();
    let mut key = NamedTempFile::new().unwrap();
    key.write_all(certified.key_pair.serialize_pem().as_bytes())
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    SelfSigned {
        cert,
        key,
        connector: TlsConnector::from(Arc::new(config)),
    }
}
