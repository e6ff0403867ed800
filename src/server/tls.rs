//! The TLS acceptor: rustls with the ring provider, a PEM certificate chain
//! and key, ALPN offering `h2` then `http/1.1`.
//!
//! The provider is passed explicitly rather than installed process-wide, so
//! another crate bringing a second rustls provider cannot make this fail.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config;

/// Why the TLS files cannot be used. Never quotes the key file's content.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: no PEM certificate found", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: malformed PEM certificate ({reason})", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{}: no PEM private key found (PKCS#8, PKCS#1 or SEC1)", path.display())]
    NoKey { path: PathBuf },
    #[error("{}: malformed PEM private key", path.display())]
    BadKey { path: PathBuf },
    #[error("the certificate and key cannot be used: {0}")]
    Unusable(#[from] rustls::Error),
}

pub fn acceptor(config: &config::Tls) -> Result<TlsAcceptor, TlsError> {
    let chain = certificates(&config.cert)?;
    let key = private_key(&config.key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(server)))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadCertificate {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoKey {
            path: path.to_owned(),
        },
        // The other errors quote lines of the file: never for a key.
        _ => TlsError::BadKey {
            path: path.to_owned(),
        },
    })
}

#[cfg(test)]
mod tests;
