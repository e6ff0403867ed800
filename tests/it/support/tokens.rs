//! Tokens as an identity provider issues them: PyJWT signs, with keys the
//! `cryptography` package generates, and the public halves are written as
//! a JWKS and as PEM files for sluice to read. Nothing here signs in
//! Rust: what sluice verifies is what a real issuer wrote.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use tempfile::TempDir;

/// Generates the keys once (kept in the issuer's directory), writes
/// `jwks.json` (kids `rsa-1`, `ec-1`, `ed-1`), `rsa.pem`, `ec.pem`,
/// `ed.pem`, then signs each spec read from stdin (one token per line).
const ISSUER: &str = r#"
import json, os, sys, time
import jwt
from jwt.algorithms import RSAAlgorithm, ECAlgorithm, OKPAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa, ec, ed25519

d = sys.argv[1]
PEM = serialization.Encoding.PEM

def key(name, make):
    path = os.path.join(d, name + ".key")
    if os.path.exists(path):
        return serialization.load_pem_private_key(open(path, "rb").read(), None)
    k = make()
    open(path, "wb").write(k.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return k

keys = {
    "rsa": key("rsa", lambda: rsa.generate_private_key(65537, 2048)),
    "ec": key("ec", lambda: ec.generate_private_key(ec.SECP256R1())),
    "ed": key("ed", ed25519.Ed25519PrivateKey.generate),
    # Never published: what a forger signs with.
    "rogue": key("rogue", lambda: rsa.generate_private_key(65537, 2048)),
}
jwks = []
for name, kid, algo, alg in [("rsa", "rsa-1", RSAAlgorithm, "RS256"), ("ec", "ec-1", ECAlgorithm, "ES256"), ("ed", "ed-1", OKPAlgorithm, "EdDSA")]:
    public = keys[name].public_key()
    jwk = algo.to_jwk(public, as_dict=True)
    jwk.update({"kid": kid, "use": "sig", "alg": alg})
    jwks.append(jwk)
    open(os.path.join(d, name + ".pem"), "wb").write(public.public_bytes(PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
open(os.path.join(d, "jwks.json"), "w").write(json.dumps({"keys": jwks}))

now = int(time.time())
for line in sys.stdin:
    spec = json.loads(line)
    claims = spec["claims"]
    for at in ("exp", "nbf", "iat"):
        if at in claims:
            claims[at] += now
    signer = spec["secret"].encode() if "secret" in spec else keys[spec["key"]]
    headers = {"kid": spec["kid"]} if spec.get("kid") else None
    print(jwt.encode(claims, signer, algorithm=spec["alg"], headers=headers), flush=True)
"#;

pub struct Issuer {
    dir: TempDir,
}

/// One token to sign: `key` is `rsa`, `ec`, `ed`, `rogue` or a secret;
/// `exp`, `nbf` and `iat` in `claims` are seconds from now.
pub struct Spec<'a> {
    pub alg: &'a str,
    pub key: Key<'a>,
    pub kid: Option<&'a str>,
    pub claims: Value,
}

pub enum Key<'a> {
    Named(&'a str),
    Secret(&'a str),
}

impl Issuer {
    /// Generates the keys and writes the public files; panics (the test
    /// fails, never skips) without python3, PyJWT or cryptography, which
    /// scripts/test.sh installs.
    pub fn new() -> Issuer {
        let issuer = Issuer {
            dir: tempfile::tempdir().expect("a temporary directory"),
        };
        issuer.sign(&[]);
        issuer
    }

    /// The tokens of `specs`, in order.
    pub fn sign(&self, specs: &[Spec<'_>]) -> Vec<String> {
        let mut child = Command::new("python3")
            .args(["-c", ISSUER])
            .arg(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 (scripts/test.sh installs PyJWT and cryptography)");
        let mut stdin = child.stdin.take().expect("piped stdin");
        for spec in specs {
            let mut line = serde_json::json!({ "alg": spec.alg, "claims": spec.claims });
            match spec.key {
                Key::Named(name) => line["key"] = name.into(),
                Key::Secret(secret) => line["secret"] = secret.into(),
            }
            if let Some(kid) = spec.kid {
                line["kid"] = kid.into();
            }
            writeln!(stdin, "{line}").expect("write a spec");
        }
        drop(stdin);
        let out = child.wait_with_output().expect("the issuer ran");
        assert!(
            out.status.success(),
            "the issuer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tokens: Vec<String> = String::from_utf8(out.stdout)
            .expect("tokens are text")
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(tokens.len(), specs.len(), "one token per spec");
        tokens
    }

    /// `jwks.json`, `rsa.pem`, `ec.pem` or `ed.pem`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
