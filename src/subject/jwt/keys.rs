//! The keys a token may be checked with, and which algorithms each one
//! verifies: a key is only ever used with its own family (an RSA key
//! never checks an HS256 token, the confusion that lets a public key be
//! used as an HMAC secret), and with the one algorithm a JWK names.

use std::path::PathBuf;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use super::Rejected;
use crate::config::Secret;

/// Where `identity.jwt` takes its keys from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// `keys_file`: a JWKS (`{"keys": [...]}`), one JWK, or PEM public
    /// keys and certificates.
    File(PathBuf),
    /// `secret`: HS256 (HS384, HS512) with a shared secret.
    Secret(Secret),
}

pub struct Key {
    kid: Option<String>,
    pub decoding: DecodingKey,
    algorithms: &'static [Algorithm],
}

pub struct Keys {
    keys: Vec<Key>,
}

const RSA: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];
const EC: &[Algorithm] = &[Algorithm::ES256, Algorithm::ES384];
const ES256: &[Algorithm] = &[Algorithm::ES256];
const ES384: &[Algorithm] = &[Algorithm::ES384];
const ED: &[Algorithm] = &[Algorithm::EdDSA];
const HMAC: &[Algorithm] = &[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];

impl Keys {
    /// The keys of `source`; the error says what is wrong without
    /// repeating a secret.
    pub fn load(source: &KeySource) -> Result<Keys, String> {
        match source {
            KeySource::Secret(secret) => {
                let bytes = secret.expose().as_bytes();
                // RFC 7518 §3.2: a key at least as long as the hash.
                if bytes.len() < 32 {
                    return Err(format!(
                        "must be at least 32 bytes long for HS256 (it is {})",
                        bytes.len()
                    ));
                }
                let decoding = DecodingKey::from_secret(bytes).map_err(|e| e.to_string())?;
                Ok(Keys {
                    keys: vec![Key {
                        kid: None,
                        decoding,
                        algorithms: HMAC,
                    }],
                })
            }
            KeySource::File(path) => {
                let bytes = std::fs::read(path)
                    .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
                let keys = parse(&bytes).map_err(|e| format!("`{}`: {e}", path.display()))?;
                Ok(Keys { keys })
            }
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys a token signed with `alg` (and naming `kid`) may have
    /// been signed with. A `kid` no key carries still reaches the keys
    /// that carry none (PEM keys, a secret).
    pub fn for_token<'k>(
        &'k self,
        alg: Algorithm,
        kid: Option<&str>,
    ) -> Result<impl Iterator<Item = &'k Key>, Rejected> {
        let fits = move |k: &&Key| k.algorithms.contains(&alg);
        if !self.keys.iter().any(|k| fits(&k)) {
            return Err(Rejected::Algorithm);
        }
        let named = kid.filter(|kid| self.keys.iter().any(|k| k.kid.as_deref() == Some(kid)));
        let chosen: Vec<&Key> = match (kid, named) {
            (_, Some(kid)) => self
                .keys
                .iter()
                .filter(|k| k.kid.as_deref() == Some(kid))
                .filter(fits)
                .collect(),
            (Some(_), None) => self
                .keys
                .iter()
                .filter(|k| k.kid.is_none())
                .filter(fits)
                .collect(),
            (None, None) => self.keys.iter().filter(fits).collect(),
        };
        match (chosen.is_empty(), named) {
            (false, _) => Ok(chosen.into_iter()),
            (true, Some(_)) => Err(Rejected::Algorithm),
            (true, None) => Err(Rejected::UnknownKey),
        }
    }
}

fn parse(bytes: &[u8]) -> Result<Vec<Key>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "is neither JSON nor PEM".to_owned())?;
    let keys = if text.trim_start().starts_with('{') {
        jwks(text)?
    } else if text.contains("-----BEGIN ") {
        pem_blocks(text)?
    } else {
        return Err("is neither a JWKS, a JWK nor PEM keys".to_owned());
    };
    if keys.is_empty() {
        return Err("holds no key that verifies signatures".to_owned());
    }
    Ok(keys)
}

/// A JWKS or one JWK. Keys for encryption, and of types or curves no
/// algorithm here verifies, are passed over: an identity provider's
/// set often holds some.
fn jwks(text: &str) -> Result<Vec<Key>, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("is not JSON: {e}"))?;
    let items = match value.get("keys") {
        Some(Value::Array(items)) => items.clone(),
        Some(_) => return Err("`keys` is not a list".to_owned()),
        None if value.get("kty").is_some() => vec![value],
        None => return Err("is JSON but neither a JWKS (`keys`) nor a JWK (`kty`)".to_owned()),
    };
    let mut keys = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let Ok(jwk) = serde_json::from_value::<Jwk>(item) else {
            continue;
        };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let family = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => RSA,
            AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                EllipticCurve::P256 => ES256,
                EllipticCurve::P384 => ES384,
                _ => continue,
            },
            AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
                EllipticCurve::Ed25519 => ED,
                _ => continue,
            },
            AlgorithmParameters::OctetKey(_) => HMAC,
            // `Other`, and whatever later versions of the crate add.
            _ => continue,
        };
        let algorithms = match jwk.common.key_algorithm {
            None => family,
            Some(alg) => match one_of(family, alg) {
                Some(one) => one,
                None => continue,
            },
        };
        let decoding = DecodingKey::from_jwk(&jwk).map_err(|e| format!("key {i}: {e}"))?;
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            decoding,
            algorithms,
        });
    }
    Ok(keys)
}

/// The one algorithm `alg` names within `family`, as a static slice.
fn one_of(family: &'static [Algorithm], alg: KeyAlgorithm) -> Option<&'static [Algorithm]> {
    let alg = match alg {
        KeyAlgorithm::HS256 => Algorithm::HS256,
        KeyAlgorithm::HS384 => Algorithm::HS384,
        KeyAlgorithm::HS512 => Algorithm::HS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    };
    let at = family.iter().position(|a| *a == alg)?;
    Some(&family[at..=at])
}

/// Every PEM block of `text`: public keys (SPKI or PKCS#1). A private key is refused: the sidecar needs only what
/// verifies, and a private key in its mount would sign for anyone.
fn pem_blocks(text: &str) -> Result<Vec<Key>, String> {
    let mut keys = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let block = &rest[start..];
        let after = &block["-----BEGIN ".len()..];
        let label_end = after.find("-----").ok_or("a PEM header is not closed")?;
        let label = &after[..label_end];
        let end_marker = format!("-----END {label}-----");
        let end = block
            .find(&end_marker)
            .ok_or_else(|| format!("`{label}` has no END line"))?
            + end_marker.len();
        let pem = &block[..end];
        rest = &block[end..];
        if label.contains("PRIVATE KEY") {
            return Err(format!(
                "holds a {label}: give sluice only the public keys that verify tokens"
            ));
        }
        if label != "PUBLIC KEY" && label != "RSA PUBLIC KEY" {
            return Err(format!(
                "holds a {label}; sluice reads PUBLIC KEY and RSA PUBLIC KEY blocks \
                 (a certificate's key: `openssl x509 -pubkey -noout`)"
            ));
        }
        keys.push(pem_key(pem, label)?);
    }
    Ok(keys)
}

/// One of the crate's PEM readers.
type Decode = fn(&[u8]) -> jsonwebtoken::errors::Result<DecodingKey>;

fn pem_key(pem: &str, label: &str) -> Result<Key, String> {
    let bytes = pem.as_bytes();
    let tries: [(Decode, &'static [Algorithm]); 3] = [
        (DecodingKey::from_rsa_pem, RSA),
        (DecodingKey::from_ec_pem, EC),
        (DecodingKey::from_ed_pem, ED),
    ];
    for (decode, algorithms) in tries {
        if let Ok(decoding) = decode(bytes) {
            return Ok(Key {
                kid: None,
                decoding,
                algorithms,
            });
        }
    }
    Err(format!(
        "a `{label}` block is no RSA, EC (P-256, P-384) or Ed25519 public key"
    ))
}
