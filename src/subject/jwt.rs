//! Verified JWT claims: `subject: jwt:CLAIM` and `tiers: { claim }`.
//!
//! A bearer token counts only when its signature checks against one of the
//! configured keys, its `exp` (required) and `nbf` hold within the leeway,
//! and its issuer and audience are the configured ones. Anything else is
//! no token at all: the limit's next subject is tried, as for a missing
//! header, and the request is counted by a bounded [`Rejected`] reason.
//! The checks and every signature algorithm are the `jsonwebtoken`
//! crate's; nothing here is cryptography, only which key a token may be
//! checked with.

mod keys;
#[cfg(test)]
mod tests;
mod verified;

use std::cell::OnceCell;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, AUTHORIZATION};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};

pub use keys::{KeySource, Keys};
use verified::{Claims, Verified};

/// Why a bearer token was not believed: a metric label, so a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not three base64url parts of JSON: not a JWT at all.
    Malformed,
    /// An algorithm no configured key verifies (`none`, or HS256 against
    /// public keys: a key is only ever used with its own algorithms).
    Algorithm,
    /// A `kid` that names none of the configured keys.
    UnknownKey,
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    /// A registered claim missing (`exp`) or of the wrong type.
    Claims,
}

impl Rejected {
    pub const ALL: [Rejected; 9] = [
        Rejected::Malformed,
        Rejected::Algorithm,
        Rejected::UnknownKey,
        Rejected::Signature,
        Rejected::Expired,
        Rejected::NotYetValid,
        Rejected::Issuer,
        Rejected::Audience,
        Rejected::Claims,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Rejected::Malformed => "malformed",
            Rejected::Algorithm => "algorithm",
            Rejected::UnknownKey => "unknown_key",
            Rejected::Signature => "signature",
            Rejected::Expired => "expired",
            Rejected::NotYetValid => "not_yet_valid",
            Rejected::Issuer => "issuer",
            Rejected::Audience => "audience",
            Rejected::Claims => "claims",
        }
    }

    fn of(error: &jsonwebtoken::errors::Error) -> Rejected {
        match error.kind() {
            ErrorKind::InvalidSignature => Rejected::Signature,
            ErrorKind::ExpiredSignature => Rejected::Expired,
            ErrorKind::ImmatureSignature => Rejected::NotYetValid,
            ErrorKind::InvalidIssuer => Rejected::Issuer,
            ErrorKind::InvalidAudience => Rejected::Audience,
            ErrorKind::MissingRequiredClaim(_) | ErrorKind::InvalidClaimFormat(_) => {
                Rejected::Claims
            }
            ErrorKind::InvalidAlgorithm
            | ErrorKind::InvalidAlgorithmName
            | ErrorKind::UnsupportedAlgorithm
            | ErrorKind::MissingAlgorithm => Rejected::Algorithm,
            // A key that does not fit the token's algorithm (an RSA
            // modulus of the wrong size, an EC key of another curve) cannot
            // have signed it.
            ErrorKind::InvalidEcdsaKey
            | ErrorKind::InvalidEddsaKey
            | ErrorKind::InvalidRsaKey(_)
            | ErrorKind::InvalidKeyFormat => Rejected::Signature,
            _ => Rejected::Malformed,
        }
    }
}

/// `identity.jwt`: the keys and what a token must say.
pub struct Verifier {
    keys: Keys,
    /// `exp` required; `nbf`, issuer and audience checked; the algorithms
    /// are set per key.
    validation: Validation,
    verified: Verified,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &self.keys.len())
            .field("issuer", &self.validation.iss)
            .field("audiences", &self.validation.aud)
            .field("leeway", &self.validation.leeway)
            .finish()
    }
}

impl Verifier {
    pub fn new(
        keys: Keys,
        issuer: Option<String>,
        audiences: Vec<String>,
        leeway: Duration,
    ) -> Verifier {
        let mut validation = Validation::new(Algorithm::RS256);
        validation.leeway = leeway.as_secs();
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(issuer) = issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        if audiences.is_empty() {
            // Without configured audiences no audience is checked; a token
            // naming one is not refused for it.
            validation.validate_aud = false;
        } else {
            validation.set_audience(&audiences);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        Verifier {
            keys,
            validation,
            verified: Verified::default(),
        }
    }

    /// Whether a token must name one of the configured audiences.
    pub fn checks_audience(&self) -> bool {
        self.validation.aud.is_some()
    }

    /// Whether a token must carry the configured issuer.
    pub fn checks_issuer(&self) -> bool {
        self.validation.iss.is_some()
    }

    /// The claims of `token` (the credential of a `Bearer` authorization),
    /// when it checks out: from the tokens verified before while they
    /// last, else checked now.
    pub fn verify(&self, token: &[u8]) -> Result<Claims, Rejected> {
        let now = jsonwebtoken::get_current_timestamp();
        let leeway = self.validation.leeway;
        let digest = verified::digest(token);
        match self.verified.get(&digest, now, leeway) {
            Some(Ok(claims)) => return Ok(claims),
            Some(Err(())) => return Err(Rejected::Expired),
            None => {}
        }
        let claims = Arc::new(self.check(token)?);
        // `exp` is required, so a verified token has one; a fraction is
        // cut down, never up.
        if let Some(exp) = claims.get("exp").and_then(Value::as_f64) {
            self.verified
                .put(digest, claims.clone(), exp.max(0.0) as u64, now, leeway);
        }
        Ok(claims)
    }

    /// Every check of `token`, its signature first.
    fn check(&self, token: &[u8]) -> Result<Map<String, Value>, Rejected> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Rejected::Malformed)?;
        let candidates = self.keys.for_token(header.alg, header.kid.as_deref())?;
        let mut last = Rejected::UnknownKey;
        for key in candidates {
            let mut validation = self.validation.clone();
            validation.algorithms = vec![header.alg];
            match jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation) {
                Ok(data) => return Ok(data.claims),
                // Another key without a `kid` may have signed it.
                Err(e) if *e.kind() == ErrorKind::InvalidSignature => last = Rejected::Signature,
                Err(e) => return Err(Rejected::of(&e)),
            }
        }
        Err(last)
    }
}

/// A request's bearer token, verified at most once however many limits
/// and routes read it.
pub struct Token<'a> {
    verifier: Option<&'a Verifier>,
    headers: &'a HeaderMap,
    verified: OnceCell<Option<Result<Claims, Rejected>>>,
}

impl<'a> Token<'a> {
    pub fn new(verifier: Option<&'a Verifier>, headers: &'a HeaderMap) -> Token<'a> {
        Token {
            verifier,
            headers,
            verified: OnceCell::new(),
        }
    }

    fn verified(&self) -> Option<&Result<Claims, Rejected>> {
        self.verified
            .get_or_init(|| {
                let verifier = self.verifier?;
                let token = bearer(self.headers)?;
                Some(verifier.verify(token))
            })
            .as_ref()
    }

    /// The value of `claim` in a verified token: a string as its bytes, a
    /// number as JSON writes it, `true`/`false`. Absent for anything else
    /// (an object, a list, `null`, an empty string) and for no verified
    /// token.
    pub fn claim(&self, claim: &str) -> Option<ClaimValue<'_>> {
        let claims = self.verified()?.as_ref().ok()?;
        match claims.get(claim)? {
            Value::String(s) if !s.is_empty() => Some(ClaimValue::Text(s)),
            Value::Number(n) => Some(ClaimValue::Owned(n.to_string())),
            Value::Bool(b) => Some(ClaimValue::Text(if *b { "true" } else { "false" })),
            _ => None,
        }
    }

    /// Whether the request's bearer token checks out, read now if no
    /// limit has read it; `None` without a token or without `identity.jwt`.
    pub fn verdict(&self) -> Option<Result<(), Rejected>> {
        self.verified()
            .map(|verified| verified.as_ref().map(|_| ()).map_err(|r| *r))
    }

    /// Why the request's token was not believed, if it carried one that
    /// was read and was not.
    pub fn rejected(&self) -> Option<Rejected> {
        match self.verified.get()? {
            Some(Err(reason)) => Some(*reason),
            _ => None,
        }
    }
}

/// A claim's value as counted.
pub enum ClaimValue<'a> {
    Text(&'a str),
    Owned(String),
}

impl ClaimValue<'_> {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            ClaimValue::Text(s) => s.as_bytes(),
            ClaimValue::Owned(s) => s.as_bytes(),
        }
    }
}

/// The credential of an `Authorization: Bearer` header, read as apps read
/// it (the scheme in any case, any run of blanks after it). `None` for no
/// header, another scheme, or a header sent twice (refused before routing
/// anyway).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next()?.as_bytes().trim_ascii();
    if values.next().is_some() {
        return None;
    }
    let scheme_end = value.iter().position(|b| *b == b' ' || *b == b'\t')?;
    let (scheme, rest) = value.split_at(scheme_end);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii_start();
    (!token.is_empty()).then_some(token)
}
