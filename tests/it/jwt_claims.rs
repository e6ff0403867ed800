//! Verified JWT claims through the binary, with tokens PyJWT issued: a
//! token that checks out gives its `sub` its own limit and its `plan` its
//! tier; a forged, expired, or misaddressed one is no token at all (the
//! limit's next subject, here the route's one shared bucket), counted by
//! reason; a rotated keys file is read again without a restart.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::ops::{metric, scrape};
use crate::support::sidecar::{run_binary, write_config};
use crate::support::tokens::{Issuer, Key, Spec};
use crate::support::{eventually, get, Sidecar, Upstream};

const ISSUER: &str = "https://auth.test";
const SECRET: &str = "a shared HS256 secret of 32 bytes!";

fn claims(sub: &str) -> Value {
    json!({ "sub": sub, "iss": ISSUER, "aud": "billing", "exp": 300 })
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

/// `jwt` is the `identity.jwt` mapping's inside; `/api` counts `jwt:sub`,
/// 2 an hour; `/plan` chooses its tier by the `plan` claim (free 1, pro 3).
fn config(upstream: &Upstream, jwt: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {}
identity:
  jwt: {{ {jwt}, issuer: \"{ISSUER}\", audiences: [billing], leeway: 5s }}
policies:
  per_user: {{ algorithm: fixed-window, limit: 2, window: 1h }}
  free: {{ algorithm: fixed-window, limit: 1, window: 1h }}
  pro: {{ algorithm: fixed-window, limit: 3, window: 1h }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    subject: jwt:sub
    policy: per_user
  - name: plan
    match: {{ path_prefix: /plan }}
    subject: jwt:sub
    tiers: {{ claim: plan, policies: {{ pro: pro }}, default: free }}
",
        upstream.url()
    )
}

async fn status(sluice: &Sidecar, path: &str, token: &str) -> u16 {
    let bearer = format!("Bearer {token}");
    get(sluice.addr(), path, &[("authorization", &bearer)])
        .await
        .0
        .as_u16()
}

/// The statuses of `n` requests to `path` with `token`.
async fn statuses(sluice: &Sidecar, path: &str, token: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(status(sluice, path, token).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_sub_has_its_own_limit_with_every_kind_of_key() {
    let issuer = Issuer::new();
    let upstream = Upstream::start().await;
    let jwks = format!("keys_file: {}", issuer.file("jwks.json").display());
    let pem = format!("keys_file: {}", issuer.file("ec.pem").display());
    let cases: [(&str, String, &str, Key<'_>, Option<&str>); 5] = [
        (
            "RS256 from a JWKS",
            jwks.clone(),
            "RS256",
            Key::Named("rsa"),
            Some("rsa-1"),
        ),
        (
            "ES256 from a JWKS",
            jwks.clone(),
            "ES256",
            Key::Named("ec"),
            Some("ec-1"),
        ),
        (
            "EdDSA from a JWKS",
            jwks,
            "EdDSA",
            Key::Named("ed"),
            Some("ed-1"),
        ),
        ("ES256 from PEM", pem, "ES256", Key::Named("ec"), None),
        (
            "HS256 from a secret",
            "secret: \"${JWT_SECRET}\"".to_owned(),
            "HS256",
            Key::Secret(SECRET),
            None,
        ),
    ];
    for (case, keys, alg, key, kid) in cases {
        let sluice = Sidecar::start_with_env(&config(&upstream, &keys), &[("JWT_SECRET", SECRET)]);
        let specs: Vec<Spec<'_>> = ["alice", "bob"]
            .into_iter()
            .map(|sub| Spec {
                alg,
                key: match key {
                    Key::Named(n) => Key::Named(n),
                    Key::Secret(s) => Key::Secret(s),
                },
                kid,
                claims: claims(sub),
            })
            .collect();
        let tokens = issuer.sign(&specs);
        assert_eq!(
            statuses(&sluice, "/api/items", &tokens[0], 3).await,
            [200, 200, 429],
            "{case}: alice's own limit"
        );
        assert_eq!(
            status(&sluice, "/api/items", &tokens[1]).await,
            200,
            "{case}: bob is not alice"
        );
        let metrics = scrape(sluice.admin_addr().expect("admin")).await;
        for reason in ["signature", "expired", "audience", "unknown_key"] {
            assert_eq!(
                metric(&metrics, "sluice_jwt_rejected_total", &[("reason", reason)]),
                Some(0.0),
                "{case}: every reason's series is there at zero"
            );
        }
    }
    // The token reaches the app as the client sent it.
    let seen = upstream.requests();
    assert!(seen.iter().all(|r| r
        .header("authorization")
        .is_some_and(|a| a.starts_with("Bearer ey"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_do_not_check_out_share_one_bucket_and_are_counted() {
    let issuer = Issuer::new();
    let upstream = Upstream::start().await;
    let keys = format!("keys_file: {}", issuer.file("jwks.json").display());
    let sluice = Sidecar::start(&config(&upstream, &keys));
    let rs256 = |key: &'static str, kid: Option<&'static str>, claims: Value| Spec {
        alg: "RS256",
        key: Key::Named(key),
        kid,
        claims,
    };
    let tokens = issuer.sign(&[
        // Signed by a key sluice was never given, claiming a known kid.
        rs256("rogue", Some("rsa-1"), claims("mallory-1")),
        rs256(
            "rsa",
            Some("rsa-1"),
            with(claims("mallory-2"), "exp", json!(-600)),
        ),
        rs256(
            "rsa",
            Some("rsa-1"),
            with(claims("mallory-3"), "aud", json!("payroll")),
        ),
        rs256(
            "rsa",
            Some("rsa-1"),
            with(claims("mallory-4"), "iss", json!("https://evil.test")),
        ),
        rs256("rsa", Some("rsa-9"), claims("mallory-5")),
        rs256("rsa", Some("rsa-1"), claims("alice")),
    ]);
    // Five subs that would each have had 2: together they have 2, the
    // route's bucket for requests without a subject.
    let mut admitted = 0;
    for token in &tokens[..5] {
        if status(&sluice, "/api/items", token).await == 200 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2, "a token that does not check out was believed");
    assert_eq!(
        statuses(&sluice, "/api/items", &tokens[5], 3).await,
        [200, 200, 429],
        "a good token still has its own limit"
    );
    let metrics = scrape(sluice.admin_addr().expect("admin")).await;
    for reason in ["signature", "expired", "audience", "issuer", "unknown_key"] {
        assert_eq!(
            metric(&metrics, "sluice_jwt_rejected_total", &[("reason", reason)]),
            Some(1.0),
            "{reason}"
        );
    }
    assert_eq!(
        metric(
            &metrics,
            "sluice_jwt_rejected_total",
            &[("reason", "malformed")]
        ),
        Some(0.0)
    );
    // A bare `Bearer junk` is malformed; no Authorization at all is no
    // token, not a bad one.
    status(&sluice, "/api/items", "junk").await;
    get(sluice.addr(), "/api/items", &[]).await;
    let metrics = scrape(sluice.admin_addr().expect("admin")).await;
    assert_eq!(
        metric(
            &metrics,
            "sluice_jwt_rejected_total",
            &[("reason", "malformed")]
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_plan_claim_chooses_the_tier() {
    let issuer = Issuer::new();
    let upstream = Upstream::start().await;
    let keys = format!("keys_file: {}", issuer.file("ed.pem").display());
    let sluice = Sidecar::start(&config(&upstream, &keys));
    let eddsa = |key: &'static str, claims: Value| Spec {
        alg: "EdDSA",
        key: Key::Named(key),
        kid: None,
        claims,
    };
    let tokens = issuer.sign(&[
        eddsa("ed", with(claims("p1"), "plan", json!("pro"))),
        eddsa("ed", with(claims("f1"), "plan", json!("free"))),
        eddsa("ed", claims("n1")),
        // `plan: pro`, signed by the forger (an RSA key passing as EdDSA
        // cannot even be tried): the default tier, in the shared bucket.
        Spec {
            alg: "RS256",
            key: Key::Named("rogue"),
            kid: None,
            claims: with(claims("p2"), "plan", json!("pro")),
        },
    ]);
    assert_eq!(
        statuses(&sluice, "/plan/x", &tokens[0], 4).await,
        [200, 200, 200, 429]
    );
    assert_eq!(
        statuses(&sluice, "/plan/x", &tokens[1], 2).await,
        [200, 429]
    );
    assert_eq!(
        statuses(&sluice, "/plan/x", &tokens[2], 2).await,
        [200, 429]
    );
    assert_eq!(
        statuses(&sluice, "/plan/x", &tokens[3], 2).await,
        [200, 429],
        "a forged pro token was given the pro tier"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_keys_file_is_read_again() {
    let issuer = Issuer::new();
    let upstream = Upstream::start().await;
    // Start trusting the EC key only.
    let keys = issuer.dir().join("served.pem");
    std::fs::copy(issuer.file("ec.pem"), &keys).expect("copy");
    let sluice = Sidecar::start(&config(
        &upstream,
        &format!("keys_file: {}", keys.display()),
    ));
    let specs: Vec<Spec<'_>> = (0..4)
        .map(|i| Spec {
            alg: "RS256",
            key: Key::Named("rsa"),
            kid: None,
            claims: claims(&format!("user-{i}")),
        })
        .collect();
    let tokens = issuer.sign(&specs);
    // Not believed: every RSA token is one shared bucket of 2.
    assert_eq!(
        [
            status(&sluice, "/api/x", &tokens[0]).await,
            status(&sluice, "/api/x", &tokens[1]).await,
            status(&sluice, "/api/x", &tokens[2]).await,
        ],
        [200, 200, 429]
    );
    // The identity provider rotates: the file now holds the RSA key.
    let rotated = issuer.dir().join("rotated.pem");
    std::fs::copy(issuer.file("rsa.pem"), &rotated).expect("copy");
    std::fs::rename(&rotated, &keys).expect("swap the keys file");
    // user-3's requests fall in the spent shared bucket (429, charging
    // nothing) until its token is believed: then it has its own.
    eventually(Duration::from_secs(15), || async {
        (status(&sluice, "/api/x", &tokens[3]).await == 200).then_some(())
    })
    .await;
}

#[test]
fn check_warns_of_tokens_checked_for_no_audience_or_issuer() {
    let run = |jwt: &str| {
        let yaml = format!(
            "version: 1
server: {{ listen: 127.0.0.1:0 }}
upstream: {{ url: http://127.0.0.1:9 }}
identity:
  jwt: {{ secret: \"{SECRET}\"{jwt} }}
policies:
  p: {{ algorithm: fixed-window, limit: 2, window: 1h }}
routes:
  - {{ name: api, subject: jwt:sub, policy: p }}
"
        );
        let (_dir, path) = write_config(&yaml);
        let (code, stdout, stderr) =
            run_binary(&["check", "--config", &path.to_string_lossy()], &[]);
        assert_eq!(code, 0, "{stderr}");
        stdout
    };
    let bare = run("");
    assert!(bare.contains("identity.jwt without `audiences`"), "{bare}");
    assert!(bare.contains("identity.jwt without `issuer`"), "{bare}");
    let full = run(", issuer: https://auth.test, audiences: [billing]");
    assert!(!full.contains("warning"), "{full}");
}
