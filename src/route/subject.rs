//! Who a limit counts: where its subject is read from.

use http::HeaderName;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectSource {
    /// The peer, or behind trusted proxies the right-most untrusted
    /// `X-Forwarded-For` address.
    ClientIp,
    Header(HeaderName),
    /// A claim of the request's verified bearer token (`jwt:sub`).
    Jwt {
        claim: Box<str>,
        /// `jwt:CLAIM`, the pseudonym's kind, written once.
        kind: Box<str>,
    },
    /// One bucket for the whole route, whoever asks.
    Global,
    /// `{ all: [...] }`: the combination of two or more sources, each of
    /// them client_ip, a header or a claim; present when all are.
    All(Box<[SubjectSource]>),
}

impl SubjectSource {
    pub fn jwt(claim: &str) -> SubjectSource {
        SubjectSource::Jwt {
            claim: claim.into(),
            kind: format!("jwt:{claim}").into(),
        }
    }

    /// The sources a request is read from: this one, or each part of a
    /// combination.
    pub fn parts(&self) -> &[SubjectSource] {
        match self {
            SubjectSource::All(parts) => parts,
            one => std::slice::from_ref(one),
        }
    }

    /// Whether this source, or a part of it, reads a verified token.
    pub fn reads_token(&self) -> bool {
        self.parts()
            .iter()
            .any(|p| matches!(p, SubjectSource::Jwt { .. }))
    }

    /// The header this source (or a part) is read from, besides the
    /// client address's `X-Forwarded-For`: the named header, or
    /// `Authorization` for a token's claim.
    pub fn headers(&self) -> impl Iterator<Item = &HeaderName> {
        self.parts().iter().filter_map(|p| match p {
            SubjectSource::Header(name) => Some(name),
            SubjectSource::Jwt { .. } => Some(&http::header::AUTHORIZATION),
            SubjectSource::ClientIp | SubjectSource::Global | SubjectSource::All(_) => None,
        })
    }
}

/// As written in the file: `client_ip`, `header:x-api-key`, `jwt:sub`,
/// `global`, `{ all: [client_ip, header:x-api-key] }`.
impl std::fmt::Display for SubjectSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubjectSource::ClientIp => f.write_str("client_ip"),
            SubjectSource::Header(name) => write!(f, "header:{name}"),
            SubjectSource::Jwt { kind, .. } => f.write_str(kind),
            SubjectSource::Global => f.write_str("global"),
            SubjectSource::All(parts) => {
                f.write_str("{ all: [")?;
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{part}")?;
                }
                f.write_str("] }")
            }
        }
    }
}
