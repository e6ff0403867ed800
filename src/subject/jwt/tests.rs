use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use super::*;
use crate::config::Secret;

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn hs256(claims: Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .expect("signs")
}

fn verifier(keys: Keys) -> Verifier {
    Verifier::new(
        keys,
        Some("https://auth.example".to_owned()),
        vec!["billing".to_owned()],
        Duration::from_secs(30),
    )
}

fn secret_keys() -> Keys {
    Keys::load(&KeySource::Secret(Secret(SECRET.to_owned()))).expect("a long secret loads")
}

fn good() -> Value {
    json!({ "sub": "alice", "iss": "https://auth.example", "aud": "billing", "exp": now() + 300, "plan": "pro" })
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

#[test]
fn a_token_that_checks_out_gives_its_claims() {
    let v = verifier(secret_keys());
    let claims = v.verify(hs256(good()).as_bytes()).expect("verified");
    assert_eq!(claims["sub"], "alice");
    // An audience list naming ours counts too.
    let listed = with(good(), "aud", json!(["other", "billing"]));
    assert!(v.verify(hs256(listed).as_bytes()).is_ok());
    // Within the leeway, an expired token still counts.
    let late = with(good(), "exp", json!(now() - 10));
    assert!(v.verify(hs256(late).as_bytes()).is_ok());
}

#[test]
fn each_failed_check_has_its_reason() {
    let v = verifier(secret_keys());
    let cases = [
        (with(good(), "exp", json!(now() - 120)), Rejected::Expired),
        (
            with(good(), "nbf", json!(now() + 120)),
            Rejected::NotYetValid,
        ),
        (
            with(good(), "iss", json!("https://evil.example")),
            Rejected::Issuer,
        ),
        (with(good(), "aud", json!("other")), Rejected::Audience),
    ];
    for (claims, reason) in cases {
        assert_eq!(
            v.verify(hs256(claims.clone()).as_bytes()).err(),
            Some(reason),
            "{claims}"
        );
    }
    let mut no_exp = good();
    no_exp.as_object_mut().unwrap().remove("exp");
    assert_eq!(
        v.verify(hs256(no_exp).as_bytes()).err(),
        Some(Rejected::Claims)
    );
    let mut no_aud = good();
    no_aud.as_object_mut().unwrap().remove("aud");
    assert_eq!(
        v.verify(hs256(no_aud).as_bytes()).err(),
        Some(Rejected::Claims)
    );

    // Another secret's signature, and a payload changed after signing.
    let forged = encode(
        &Header::new(Algorithm::HS256),
        &good(),
        &EncodingKey::from_secret(b"another secret, just as long as ours").unwrap(),
    )
    .unwrap();
    assert_eq!(v.verify(forged.as_bytes()).err(), Some(Rejected::Signature));
    let token = hs256(good());
    let parts: Vec<&str> = token.split('.').collect();
    let payload = base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        with(good(), "sub", json!("mallory")).to_string(),
    );
    let swapped = format!("{}.{payload}.{}", parts[0], parts[2]);
    assert_eq!(
        v.verify(swapped.as_bytes()).err(),
        Some(Rejected::Signature)
    );

    for junk in ["", "abc", "a.b.c", "....."] {
        assert_eq!(
            v.verify(junk.as_bytes()).err(),
            Some(Rejected::Malformed),
            "{junk:?}"
        );
    }
}

#[test]
fn the_none_algorithm_and_a_public_key_used_as_a_secret_are_refused() {
    let pair = rcgen::KeyPair::generate().expect("a P-256 key");
    let public = pair.public_key_pem();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.pem");
    std::fs::write(&file, &public).unwrap();
    let v = verifier(Keys::load(&KeySource::File(file)).expect("a PEM public key loads"));

    // ES256, signed with the private half: counts.
    let es256 = encode(
        &Header::new(Algorithm::ES256),
        &good(),
        &EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    assert_eq!(
        v.verify(es256.as_bytes()).map(|c| c["sub"].clone()),
        Ok(json!("alice"))
    );

    // HS256 keyed with the public key's own PEM text: the confusion that
    // forges tokens where a key is used with any algorithm.
    let confused = encode(
        &Header::new(Algorithm::HS256),
        &good(),
        &EncodingKey::from_secret(public.as_bytes()).unwrap(),
    )
    .unwrap();
    assert_eq!(
        v.verify(confused.as_bytes()).err(),
        Some(Rejected::Algorithm)
    );

    // `alg: none`, no signature.
    let b64 = |v: Value| {
        base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            v.to_string(),
        )
    };
    let unsigned = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "typ": "JWT"})),
        b64(good())
    );
    assert!(matches!(
        v.verify(unsigned.as_bytes()).err(),
        Some(Rejected::Malformed | Rejected::Algorithm)
    ));
}

#[test]
fn a_jwks_chooses_by_kid_and_skips_keys_it_cannot_use() {
    let a = rcgen::KeyPair::generate().unwrap();
    let b = rcgen::KeyPair::generate().unwrap();
    let jwk = |pair: &rcgen::KeyPair, kid: &str| {
        let key = jsonwebtoken::DecodingKey::from_ec_pem(pair.public_key_pem().as_bytes()).unwrap();
        let mut jwk =
            jsonwebtoken::jwk::Jwk::from_decoding_key(&key, Some(Algorithm::ES256)).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        serde_json::to_value(jwk).unwrap()
    };
    let set = json!({ "keys": [
        { "kty": "RSA", "use": "enc", "kid": "enc", "n": "AQAB", "e": "AQAB" },
        { "kty": "weird", "kid": "x" },
        jwk(&a, "a"),
        jwk(&b, "b"),
    ]});
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, set.to_string()).unwrap();
    let keys = Keys::load(&KeySource::File(file)).expect("loads");
    assert_eq!(
        keys.len(),
        2,
        "the encryption key and the unknown type are passed over"
    );
    let v = verifier(keys);
    let signed = |pair: &rcgen::KeyPair, kid: Option<&str>| {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = kid.map(str::to_owned);
        encode(
            &header,
            &good(),
            &EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap()
    };
    assert!(v.verify(signed(&b, Some("b")).as_bytes()).is_ok());
    assert!(
        v.verify(signed(&a, None).as_bytes()).is_ok(),
        "no kid: every key is tried"
    );
    assert_eq!(
        v.verify(signed(&a, Some("b")).as_bytes()).err(),
        Some(Rejected::Signature),
        "the kid names b: a's signature is not b's"
    );
    assert_eq!(
        v.verify(signed(&a, Some("c")).as_bytes()).err(),
        Some(Rejected::UnknownKey)
    );
}

#[test]
fn key_files_that_cannot_verify_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let load = |name: &str, text: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        Keys::load(&KeySource::File(file)).err().expect("refused")
    };
    let private = rcgen::KeyPair::generate().unwrap().serialize_pem();
    assert!(load("private.pem", &private).contains("PRIVATE KEY"));
    assert!(load("empty.json", r#"{"keys": []}"#).contains("no key"));
    assert!(load("text", "hello").contains("neither"));
    assert!(load("bad.json", "{").contains("not JSON"));
    let short = Keys::load(&KeySource::Secret(Secret("short".to_owned())))
        .err()
        .unwrap();
    assert!(short.contains("at least 32 bytes"), "{short}");
    assert!(!short.contains("short\""), "the secret is not repeated");
}

#[test]
fn a_request_reads_its_bearer_token_once_and_as_apps_do() {
    let v = verifier(secret_keys());
    let token = hs256(good());
    for spelling in [
        format!("Bearer {token}"),
        format!("bearer  {token}"),
        format!("BEARER\t{token}"),
    ] {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(&spelling).unwrap());
        let t = Token::new(Some(&v), &headers);
        assert_eq!(
            t.claim("sub").map(|c| c.as_bytes().to_vec()),
            Some(b"alice".to_vec())
        );
        assert_eq!(
            t.claim("plan").map(|c| c.as_bytes().to_vec()),
            Some(b"pro".to_vec())
        );
        assert!(t.claim("missing").is_none());
        assert_eq!(t.rejected(), None);
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_static("Basic YWxpY2U6czNjcmV0"),
    );
    let t = Token::new(Some(&v), &headers);
    assert!(t.claim("sub").is_none());
    assert_eq!(
        t.rejected(),
        None,
        "another scheme is no token, not a bad one"
    );

    let expired = hs256(with(good(), "exp", json!(now() - 600)));
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {expired}")).unwrap(),
    );
    let t = Token::new(Some(&v), &headers);
    assert!(t.claim("sub").is_none());
    assert_eq!(t.rejected(), Some(Rejected::Expired));

    // Numbers and booleans are counted as written; objects are no value.
    let odd = hs256(with(
        with(good(), "uid", json!(42)),
        "org",
        json!({ "id": 1 }),
    ));
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {odd}")).unwrap(),
    );
    let t = Token::new(Some(&v), &headers);
    assert_eq!(
        t.claim("uid").map(|c| c.as_bytes().to_vec()),
        Some(b"42".to_vec())
    );
    assert!(t.claim("org").is_none());
}

#[test]
fn only_tokens_that_checked_out_are_remembered_and_only_until_they_expire() {
    let v = verifier(secret_keys());
    let token = hs256(good());
    let first = v.verify(token.as_bytes()).expect("verified");
    let again = v.verify(token.as_bytes()).expect("verified again");
    assert!(Arc::ptr_eq(&first, &again), "the second use is remembered");
    assert_eq!(v.verified.len(), 1);
    for bad in [
        hs256(with(good(), "aud", json!("other"))),
        "a.b.c".to_owned(),
    ] {
        assert!(v.verify(bad.as_bytes()).is_err());
    }
    assert_eq!(v.verified.len(), 1, "a refused token is not remembered");

    // Expiry is checked on every use, with the leeway.
    let set = verified::Verified::default();
    let claims: verified::Claims = Arc::new(Map::new());
    let d = verified::digest(b"token");
    set.put(d, claims.clone(), 1_000, 900, 30);
    assert!(matches!(set.get(&d, 1_030, 30), Some(Ok(_))));
    assert!(matches!(set.get(&d, 1_031, 30), Some(Err(()))));
    assert!(
        set.get(&d, 1_031, 30).is_none(),
        "an expired token is forgotten"
    );
    // A full set drops what expired first, and never grows past its size.
    for i in 0u32..5000 {
        let exp = if i < 100 { 950 } else { 10_000 };
        set.put(
            verified::digest(&i.to_be_bytes()),
            claims.clone(),
            exp,
            1_000,
            0,
        );
    }
    assert!(set.len() <= 4096, "{}", set.len());
}
