use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Uri, Version};

use crate::route::SubjectSource;
use crate::subject::resolve::X_FORWARDED_FOR;

use super::checks::REG_NAME;
use super::rewrite::{hop_by_hop_at, ip_text, IP_TEXT_MAX};
use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    h
}

/// [`check_head`]'s verdict alone.
fn checked_head(
    method: &Method,
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), Invalid> {
    check_head(method, version, uri, headers).map(|_| ())
}

#[test]
fn the_head_check_says_whether_a_connection_field_came() {
    let v = Version::HTTP_11;
    let head = |pairs: &[(&str, &str)]| check_head(&Method::GET, v, &origin(), &headers(pairs));
    assert!(
        head(&[("host", "a"), ("connection", "close")])
            .unwrap()
            .connection
    );
    assert!(
        head(&[("connection", "x-a"), ("host", "a"), ("x-a", "1")])
            .unwrap()
            .connection
    );
    assert!(
        !head(&[("host", "a"), ("x-connection", "close")])
            .unwrap()
            .connection
    );
    assert!(!head(&[("host", "a")]).unwrap().connection);
}

fn origin() -> Uri {
    Uri::from_static("/path?q=1")
}

/// [`prepare_request`], with the fields read as the forward reads them.
fn prepare(
    h: &mut HeaderMap,
    host: Option<Addressed>,
    forwarded: Forwarded,
    upgrade: Option<HeaderValue>,
) {
    let fields = RequestFields::of(h);
    prepare_request(h, fields, host, forwarded, upgrade);
}

/// The host the client addressed, as the forward finds it.
fn original_host(uri: &Uri, h: &HeaderMap) -> Option<Addressed> {
    RequestFields::of(h).addressed(uri)
}

/// [`prepare_response`], with the fields read as the forward reads them.
fn respond(h: &mut HeaderMap, upgraded: bool) {
    let fields = ResponseFields::of(h);
    prepare_response(h, &fields, upgraded);
}

#[test]
fn http11_needs_exactly_one_host() {
    let v = Version::HTTP_11;
    assert_eq!(
        checked_head(&Method::GET, v, &origin(), &headers(&[])),
        Err(Invalid::MissingHost)
    );
    assert_eq!(
        checked_head(
            &Method::GET,
            v,
            &origin(),
            &headers(&[("host", "a"), ("host", "b")])
        ),
        Err(Invalid::DuplicateHost)
    );
    assert_eq!(
        checked_head(
            &Method::GET,
            v,
            &origin(),
            &headers(&[("host", "a"), ("host", "a")])
        ),
        Err(Invalid::DuplicateHost)
    );
    assert_eq!(
        checked_head(&Method::GET, v, &origin(), &headers(&[("host", "a")])),
        Ok(())
    );
    // HTTP/1.0 predates Host.
    assert_eq!(
        checked_head(&Method::GET, Version::HTTP_10, &origin(), &headers(&[])),
        Ok(())
    );
}

#[test]
fn http2_takes_the_authority_and_refuses_a_contradicting_host() {
    let v = Version::HTTP_2;
    let with_authority = Uri::from_static("https://example.com/x");
    assert_eq!(
        checked_head(&Method::GET, v, &with_authority, &headers(&[])),
        Ok(())
    );
    assert_eq!(
        checked_head(
            &Method::GET,
            v,
            &with_authority,
            &headers(&[("host", "EXAMPLE.com")])
        ),
        Ok(())
    );
    assert_eq!(
        checked_head(
            &Method::GET,
            v,
            &with_authority,
            &headers(&[("host", "other.com")])
        ),
        Err(Invalid::HostMismatch)
    );
    assert_eq!(
        checked_head(&Method::GET, v, &origin(), &headers(&[])),
        Err(Invalid::MissingHost)
    );
    assert_eq!(
        checked_head(&Method::GET, v, &origin(), &headers(&[("host", "a")])),
        Ok(())
    );
}

#[test]
fn connect_is_refused() {
    let h = headers(&[("host", "example.com:443")]);
    let uri = Uri::from_static("example.com:443");
    assert_eq!(
        checked_head(&Method::CONNECT, Version::HTTP_11, &uri, &h),
        Err(Invalid::Connect)
    );
}

#[test]
fn only_a_single_plain_chunked_coding_is_accepted() {
    let v = Version::HTTP_11;
    let ok = |te: &[&str]| {
        let mut pairs = vec![("host", "a")];
        pairs.extend(te.iter().map(|t| ("transfer-encoding", *t)));
        checked_head(&Method::POST, v, &origin(), &headers(&pairs))
    };
    assert_eq!(ok(&[]), Ok(()));
    assert_eq!(ok(&["chunked"]), Ok(()));
    assert_eq!(ok(&[" Chunked "]), Ok(()));
    // Framed by a final `chunked`, but with a coding sluice does not
    // implement: 501.
    for bad in [
        &["gzip, chunked"][..],
        &["chunked, chunked"],
        &["chunked", "chunked"],
        &["gzip", "chunked"],
    ] {
        assert_eq!(ok(bad), Err(Invalid::TransferCoding), "{bad:?}");
    }
    // No final `chunked`: where the body ends is unknown, 400.
    for bad in [
        &["gzip"][..],
        &["identity"],
        &["chunked, gzip"],
        &["chunked", "gzip"],
        &[""],
        &[","],
    ] {
        assert_eq!(ok(bad), Err(Invalid::UnframedBody), "{bad:?}");
    }
    let h10 = headers(&[("host", "a"), ("transfer-encoding", "chunked")]);
    assert_eq!(
        checked_head(&Method::POST, Version::HTTP_10, &origin(), &h10),
        Err(Invalid::UnframedBody)
    );
}

#[test]
fn connection_naming_an_identity_header_is_refused() {
    let api_key = HeaderName::from_static("x-api-key");
    let subject = [
        SubjectSource::Header(api_key.clone()),
        SubjectSource::ClientIp,
    ];
    assert_eq!(
        check_connection(
            &headers(&[("connection", "keep-alive, X-API-Key")]),
            &subject
        ),
        Err(Invalid::ConnectionNamesIdentity(api_key))
    );
    // X-Forwarded-For is refused whatever the subject is.
    let header_only = [SubjectSource::Header(HeaderName::from_static("x-user"))];
    assert_eq!(
        check_connection(
            &headers(&[("connection", "close"), ("connection", "x-forwarded-for")]),
            &header_only
        ),
        Err(Invalid::ConnectionNamesIdentity(X_FORWARDED_FOR.clone()))
    );
    assert_eq!(
        check_connection(&headers(&[("connection", "keep-alive, x-other")]), &subject),
        Ok(())
    );
}

#[test]
fn the_claims_by_length_are_the_claims_exactly() {
    let mut table: Vec<&str> = (0..64).flat_map(claims_of_length).copied().collect();
    let mut claims: Vec<&str> = REMOVED_CLAIMS
        .iter()
        .chain([&X_REAL_IP, &http::header::FORWARDED])
        .map(|name| name.as_str())
        .collect();
    table.sort_unstable();
    claims.sort_unstable();
    assert_eq!(table, claims);
    for len in 0..64 {
        assert!(
            claims_of_length(len).iter().all(|name| name.len() == len),
            "{len}"
        );
    }
}

#[test]
fn every_claim_is_a_claim_and_common_fields_are_not() {
    let claims = REMOVED_CLAIMS
        .iter()
        .chain([&X_REAL_IP, &http::header::FORWARDED]);
    for name in claims {
        assert!(is_claim(name), "{name}");
    }
    for other in [
        "host",
        "user-agent",
        "accept",
        "accept-encoding",
        "accept-language",
        "cookie",
        "authorization",
        "content-length",
        "x-forwarded-for",
        "x-real-ip2",
        "x-forwarded-portx",
        "true-client-iq",
        "cf-connecting-iq",
        "x-original-forwarded-fox",
    ] {
        assert!(!is_claim(&HeaderName::from_static(other)), "{other}");
    }
}

#[test]
fn every_hop_by_hop_name_is_found_by_its_length_and_no_other_name_is() {
    for (i, &name) in HOP_BY_HOP.iter().enumerate() {
        assert_eq!(hop_by_hop_at(name, name.as_str()), Some(i), "{name}");
    }
    assert_eq!(*HOP_BY_HOP[TRANSFER_ENCODING_AT], TRANSFER_ENCODING);
    assert_eq!(*HOP_BY_HOP[UPGRADE_AT], UPGRADE);
    for other in [
        "date",
        "server",
        "content-type",
        "content-length",
        "connectiox",
        "keep-alivf",
        "tee",
        "trailers",
        "upgrade-insecure-requests",
        "x-forwarded-for",
        "http2-settingz",
        "host",
        "proxy-connectiom",
        "transfer-encodinf",
        "proxy-authenticatf",
        "proxy-authorizatiom",
    ] {
        let name = HeaderName::from_static(other);
        assert_eq!(hop_by_hop_at(&name, name.as_str()), None, "{other}");
    }
}

#[test]
fn hop_by_hop_and_connection_named_headers_are_stripped() {
    let mut h = headers(&[
        ("connection", "close, X-Secret"),
        ("connection", "x-other"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("proxy-authorization", "Basic x"),
        ("te", "trailers"),
        ("trailer", "x-checksum"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "websocket"),
        ("x-secret", "1"),
        ("x-other", "2"),
        ("x-kept", "3"),
        ("content-type", "text/plain"),
    ]);
    strip_hop_by_hop(&mut h);
    let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
    assert_eq!(left, ["x-kept", "content-type"]);
}

#[test]
fn a_connection_of_keep_alive_alone_is_stripped_with_its_keep_alive_and_a_mix_still_names() {
    for (connection, left) in [
        (&["keep-alive"][..], &["x-kept", "x-secret"][..]),
        (&["Keep-Alive, close"], &["x-kept", "x-secret"]),
        (&["close", "keep-alive"], &["x-kept", "x-secret"]),
        // A token beside them is still a field to remove.
        (&["keep-alive, X-Secret"], &["x-kept"]),
        (&["keep-alive", "x-secret"], &["x-kept"]),
    ] {
        let mut fields: Vec<(&str, &str)> = connection.iter().map(|c| ("connection", *c)).collect();
        fields.extend([
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("x-kept", "3"),
        ]);
        let mut h = headers(&fields);
        strip_hop_by_hop(&mut h);
        let mut kept: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        kept.sort_unstable();
        assert_eq!(kept, left, "{connection:?}");
    }
}

fn forwarded(peer: &str, tls: bool) -> Forwarded {
    let peer = peer.parse().unwrap();
    Forwarded {
        peer,
        peer_value: peer_value(peer),
        tls,
        trusted: false,
    }
}

/// `host`, named by the request's own `Host` field.
fn in_host_field(host: &'static str) -> Option<Addressed> {
    Some(Addressed {
        host: HeaderValue::from_static(host),
        in_host_field: true,
    })
}

#[test]
fn an_untrusted_clients_address_claims_do_not_reach_the_app() {
    let claims = [
        ("x-real-ip", "6.6.6.6"),
        ("true-client-ip", "6.6.6.7"),
        ("cf-connecting-ip", "6.6.6.8"),
        ("forwarded", "for=6.6.6.9"),
        ("accept", "*/*"),
    ];
    let mut h = headers(&claims);
    prepare(&mut h, None, forwarded("10.1.2.3", false), None);
    assert_eq!(h["x-real-ip"], "10.1.2.3");
    for gone in ["true-client-ip", "cf-connecting-ip", "forwarded"] {
        assert!(!h.contains_key(gone), "{gone}");
    }
    assert_eq!(h["accept"], "*/*");

    // A trusted proxy's are its word; this hop is appended to Forwarded.
    let mut h = headers(&claims);
    let trusted = Forwarded {
        trusted: true,
        ..forwarded("10.1.2.3", false)
    };
    prepare(&mut h, None, trusted, None);
    assert_eq!(h["x-real-ip"], "6.6.6.6");
    assert_eq!(h["true-client-ip"], "6.6.6.7");
    assert_eq!(h["cf-connecting-ip"], "6.6.6.8");
    assert_eq!(h["forwarded"], "for=6.6.6.9, for=10.1.2.3");
    let mut h = headers(&[("forwarded", "for=a"), ("forwarded", "for=b")]);
    let trusted6 = Forwarded {
        trusted: true,
        ..forwarded("fd00::1", false)
    };
    prepare(&mut h, None, trusted6, None);
    assert_eq!(h.get_all("forwarded").iter().count(), 1);
    assert_eq!(h["forwarded"], "for=a, for=b, for=\"[fd00::1]\"");
}

#[test]
fn every_removed_claim_goes_from_an_untrusted_client_alone() {
    for claim in &REMOVED_CLAIMS {
        // Alone, so nothing else on the request sends it to the rewrite.
        let mut h = HeaderMap::new();
        h.append(claim, HeaderValue::from_static("6.6.6.6"));
        h.append(claim, HeaderValue::from_static("6.6.6.7"));
        h.insert("accept", HeaderValue::from_static("*/*"));
        prepare(&mut h, None, forwarded("10.1.2.3", false), None);
        assert!(!h.contains_key(claim), "{claim}");
        assert_eq!(h["accept"], "*/*");

        let mut h = HeaderMap::new();
        h.append(claim, HeaderValue::from_static("6.6.6.6"));
        let trusted = Forwarded {
            trusted: true,
            ..forwarded("10.1.2.3", false)
        };
        prepare(&mut h, None, trusted, None);
        assert_eq!(h[claim], "6.6.6.6", "{claim}");
    }
}

/// The fields of the table under `### Address claims` in
/// docs/SECURITY.md whose second column is `read by`.
fn documented_claims(doc: &str) -> Vec<String> {
    let section = doc
        .split("### Address claims")
        .nth(1)
        .expect("docs/SECURITY.md has an Address claims section");
    section
        .lines()
        .skip_while(|line| !line.starts_with("| field | read by |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let field = line.split('|').nth(1).unwrap_or_default().trim();
            field.trim_matches('`').to_ascii_lowercase()
        })
        .collect()
}

#[test]
fn the_security_docs_list_exactly_the_removed_claims() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/SECURITY.md");
    let doc = std::fs::read_to_string(&path).expect("docs/SECURITY.md");
    let code: Vec<String> = REMOVED_CLAIMS.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        documented_claims(&doc),
        code,
        "docs/SECURITY.md's address claims table is not REMOVED_CLAIMS in src/proxy/headers/mod.rs"
    );
}

#[test]
fn request_gets_forwarded_fields_and_keeps_host() {
    let mut h = headers(&[
        ("host", "app.example"),
        ("connection", "x-forwarded-proto, host"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "7.7.7.7, "),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "evil.example"),
    ]);
    let host = original_host(&origin(), &h);
    prepare(&mut h, host, forwarded("::ffff:10.1.2.3", false), None);
    assert_eq!(h["host"], "app.example");
    assert_eq!(h["x-forwarded-host"], "app.example");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    assert_eq!(h["x-forwarded-for"], "6.6.6.6, 7.7.7.7, 10.1.2.3");
    assert!(!h.contains_key(CONNECTION));
}

#[test]
fn a_host_field_that_named_the_host_stays_as_it_is() {
    let mut h = headers(&[("host", "app.example"), ("connection", "keep-alive")]);
    let host = original_host(&origin(), &h);
    assert!(host.as_ref().is_some_and(|a| a.in_host_field));
    prepare(&mut h, host, forwarded("10.1.2.3", false), None);
    assert_eq!(h.get_all("host").iter().count(), 1);
    assert_eq!(h["host"], "app.example");
    assert_eq!(h["x-forwarded-host"], "app.example");

    // An absolute-form target overrides the field (RFC 9112 §3.2.2).
    let mut h = headers(&[("host", "other.example")]);
    let uri = Uri::from_static("http://app.example/x");
    let host = original_host(&uri, &h);
    assert!(host.as_ref().is_some_and(|a| !a.in_host_field));
    prepare(&mut h, host, forwarded("10.1.2.3", false), None);
    assert_eq!(h.get_all("host").iter().count(), 1);
    assert_eq!(h["host"], "app.example");
}

#[test]
fn http2_authority_becomes_host() {
    let mut h = headers(&[]);
    let uri = Uri::from_static("https://app.example:8443/x");
    let host = original_host(&uri, &h);
    prepare(&mut h, host, forwarded("192.0.2.1", true), None);
    assert_eq!(h["host"], "app.example:8443");
    assert_eq!(h["x-forwarded-proto"], "https");
    assert_eq!(h["x-forwarded-for"], "192.0.2.1");
}

#[test]
fn upgrade_keeps_connection_and_upgrade_only() {
    let mut h = headers(&[
        ("host", "a"),
        ("connection", "Upgrade, x-drop"),
        ("upgrade", "websocket"),
        ("x-drop", "1"),
        ("sec-websocket-key", "k"),
    ]);
    assert!(is_upgrade(Version::HTTP_11, &h));
    assert!(!is_upgrade(Version::HTTP_10, &h));
    let upgrade = allowed_upgrade(Version::HTTP_11, &h, &websocket());
    assert_eq!(upgrade, Some(HeaderValue::from_static("websocket")));
    prepare(
        &mut h,
        in_host_field("a"),
        forwarded("192.0.2.1", false),
        upgrade,
    );
    assert_eq!(h["connection"], "upgrade");
    assert_eq!(h["upgrade"], "websocket");
    assert_eq!(h["sec-websocket-key"], "k");
    assert!(!h.contains_key("x-drop"));

    let without_token = headers(&[("connection", "keep-alive"), ("upgrade", "websocket")]);
    assert!(!is_upgrade(Version::HTTP_11, &without_token));
}

#[test]
fn only_a_request_with_an_upgrade_field_offers_an_upgrade() {
    // The forward asks `allowed_upgrade` only of these.
    let offers = |pairs: &[(&str, &str)]| RequestFields::of(&headers(pairs)).offers_upgrade();
    assert!(offers(&[
        ("connection", "upgrade"),
        ("upgrade", "websocket")
    ]));
    assert!(offers(&[("host", "a"), ("Upgrade", "websocket")]));
    assert!(!offers(&[("connection", "upgrade")]));
    assert!(!offers(&[
        ("connection", "upgrade"),
        ("upgrades", "websocket")
    ]));
    assert!(!offers(&[("host", "a"), ("te", "trailers")]));
}

#[test]
fn a_response_head_is_measured_as_written() {
    let h = headers(&[("content-type", "text/plain"), ("x-a", ""), ("x-a", "12")]);
    // `content-type: text/plain\r\n`, `x-a: \r\n`, `x-a: 12\r\n`.
    assert_eq!(ResponseFields::of(&h).bytes(), 26 + 7 + 9);
    assert!(!ResponseFields::of(&h).transfer_encoding());
    let h = headers(&[("transfer-encoding", "chunked")]);
    assert!(ResponseFields::of(&h).transfer_encoding());
}

fn websocket() -> Vec<Box<str>> {
    vec![Box::from("websocket")]
}

#[test]
fn only_allowed_upgrades_are_offered_upstream() {
    let offer = |upgrade: &str, allowed: &[&str]| {
        let h = headers(&[("connection", "upgrade"), ("upgrade", upgrade)]);
        let allowed: Vec<Box<str>> = allowed.iter().map(|a| Box::from(*a)).collect();
        allowed_upgrade(Version::HTTP_11, &h, &allowed)
    };
    assert_eq!(offer("h2c", &["websocket"]), None);
    assert_eq!(offer("foo/1.0", &["websocket"]), None);
    assert_eq!(
        offer("WebSocket", &["websocket"]),
        Some(HeaderValue::from_static("WebSocket"))
    );
    assert_eq!(
        offer("foo/1.0", &["foo"]),
        Some(HeaderValue::from_static("foo/1.0"))
    );
    assert_eq!(
        offer("h2c, websocket", &["websocket"]),
        Some(HeaderValue::from_static("websocket"))
    );
    assert_eq!(offer("websocket", &[]), None);
}

#[test]
fn a_refused_upgrade_goes_as_a_plain_request() {
    let mut h = headers(&[
        ("host", "a"),
        ("connection", "Upgrade, HTTP2-Settings"),
        ("upgrade", "h2c"),
        ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
        ("x-original-url", "/login"),
        ("x-rewrite-url", "/login"),
    ]);
    let upgrade = allowed_upgrade(Version::HTTP_11, &h, &websocket());
    prepare(
        &mut h,
        in_host_field("a"),
        forwarded("192.0.2.1", false),
        upgrade,
    );
    for gone in [
        "connection",
        "upgrade",
        "http2-settings",
        "x-original-url",
        "x-rewrite-url",
    ] {
        assert!(!h.contains_key(gone), "{gone} was forwarded");
    }
    // Not named by Connection, still removed.
    let mut h = headers(&[("host", "a"), ("http2-settings", "AAMAAABk")]);
    prepare(&mut h, None, forwarded("192.0.2.1", false), None);
    assert!(!h.contains_key("http2-settings"));
}

#[test]
fn lower_case_methods_are_refused() {
    let v = Version::HTTP_11;
    let h = headers(&[("host", "a")]);
    for method in ["post", "PoSt", "get", "gET"] {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        assert_eq!(
            checked_head(&method, v, &origin(), &h),
            Err(Invalid::MethodCase),
            "{method}"
        );
    }
    for method in ["POST", "PROPFIND", "M-SEARCH"] {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        assert_eq!(checked_head(&method, v, &origin(), &h), Ok(()), "{method}");
    }
}

#[test]
fn an_identity_header_sent_twice_is_refused() {
    let names = [HeaderName::from_static("x-api-key")];
    assert_eq!(
        check_identity_headers(&headers(&[("x-api-key", "a"), ("x-api-key", "b")]), &names),
        Err(Invalid::DuplicateIdentity(names[0].clone()))
    );
    assert_eq!(
        check_identity_headers(
            &headers(&[("x-api-key", "a"), ("x-other", "b"), ("x-other", "c")]),
            &names
        ),
        Ok(())
    );
}

#[test]
fn response_drops_a_content_length_that_chunking_overrode() {
    let mut h = headers(&[
        ("transfer-encoding", "chunked"),
        ("content-length", "5"),
        ("connection", "x-internal"),
        ("x-internal", "1"),
        ("upgrade", "h2c"),
    ]);
    respond(&mut h, false);
    assert!(h.is_empty(), "{h:?}");

    let mut h = headers(&[("content-length", "5")]);
    respond(&mut h, false);
    assert_eq!(h["content-length"], "5");

    let mut h = headers(&[("connection", "upgrade"), ("upgrade", "websocket")]);
    respond(&mut h, true);
    assert_eq!(h["connection"], "upgrade");
    assert_eq!(h["upgrade"], "websocket");
}

#[test]
fn only_what_is_hop_by_hop_goes() {
    let mut plain = headers(&[("host", "a"), ("accept", "*/*")]);
    strip_hop_by_hop(&mut plain);
    assert_eq!(plain.len(), 2);

    // One hop-by-hop field, naming another by a token of odd case; a token
    // that is no header name at all is ignored.
    let mut h = headers(&[
        ("x-a", "1"),
        ("connection", "Keep-Alive, X-A, bad token, ,"),
        ("keep-alive", "timeout=5"),
        ("x-b", "2"),
    ]);
    strip_hop_by_hop(&mut h);
    let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
    assert_eq!(left, ["x-b"]);
}

#[test]
fn peer_addresses_are_written_as_display_writes_them() {
    for ip in [
        "0.0.0.0",
        "1.2.3.4",
        "10.200.30.255",
        "255.255.255.255",
        "::",
        "::1",
        "2001:db8::8a2e:370:7334",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "::ffff:255.255.255.255",
        "64:ff9b::255.255.255.255",
    ] {
        let ip: IpAddr = ip.parse().unwrap();
        let mut buf = [0u8; IP_TEXT_MAX];
        assert_eq!(ip_text(ip, &mut buf), ip.to_string().as_bytes(), "{ip}");
    }
}

#[test]
fn the_reg_name_table_holds_unreserved_and_sub_delimiters_only() {
    let allowed: Vec<u8> = (b'a'..=b'z')
        .chain(b'A'..=b'Z')
        .chain(b'0'..=b'9')
        .chain(*b"-._~!$&'()*+,;=")
        .collect();
    for b in 0..=255u8 {
        assert_eq!(REG_NAME[usize::from(b)], allowed.contains(&b), "byte {b}");
    }
}

#[test]
fn hosts_must_be_host_and_port() {
    let v = Version::HTTP_11;
    for good in [
        "app.test",
        "app.test:8080",
        "127.0.0.1",
        "127.0.0.1:80",
        "app:65535",
        "app:00080",
        "[::1]",
        "[2001:db8::1]:443",
        "xn--bcher-kva.example",
        "app:",
        "caf%C3%A9.test",
    ] {
        assert_eq!(
            checked_head(&Method::GET, v, &origin(), &headers(&[("host", good)])),
            Ok(()),
            "{good}"
        );
    }
    for bad in [
        "",
        "a b",
        "app/x",
        "[::1",
        "[::1]x",
        "[nonsense]",
        "app:99999",
        "app:65536",
        "app:000080",
        "app:8o",
        "u@app",
        "app:80:80",
        // Found by the `request_head` fuzz target: `%` only starts an escape.
        "%",
        "app%",
        "app%4",
        "app%zz.test",
    ] {
        assert_eq!(
            checked_head(&Method::GET, v, &origin(), &headers(&[("host", bad)])),
            Err(Invalid::BadHost),
            "{bad:?}"
        );
    }
}

#[test]
fn request_targets_are_origin_or_absolute_form() {
    let h = headers(&[("host", "a")]);
    let v = Version::HTTP_11;
    for ok in ["/x", "http://app.test/x", "http://app.test:80"] {
        let uri: Uri = ok.parse().unwrap();
        assert_eq!(checked_head(&Method::GET, v, &uri, &h), Ok(()), "{ok}");
    }
    let star: Uri = "*".parse().unwrap();
    assert_eq!(checked_head(&Method::OPTIONS, v, &star, &h), Ok(()));
    for method in [Method::GET, Method::POST, Method::HEAD, Method::DELETE] {
        assert_eq!(
            checked_head(&method, v, &star, &h),
            Err(Invalid::AsteriskForm),
            "{method}"
        );
    }
    for bad in ["app:80", "app.test"] {
        let uri: Uri = bad.parse().unwrap();
        assert_eq!(
            checked_head(&Method::POST, v, &uri, &h),
            Err(Invalid::RequestTarget),
            "{bad}"
        );
    }
}

/// `:path: *` as hyper hands it over: h2 keeps `:scheme` only beside an
/// `:authority`, so a client that sends one (every browser and curl does)
/// gives a URI with a scheme, an authority and the path `*`.
fn h2_asterisk(authority: Option<&str>) -> Uri {
    let mut parts = http::uri::Parts::default();
    if let Some(authority) = authority {
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(authority.parse().unwrap());
    }
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static("*"));
    Uri::from_parts(parts).unwrap()
}

#[test]
fn an_http2_asterisk_path_is_for_options_alone_with_or_without_authority() {
    let v = Version::HTTP_2;
    let h = headers(&[]);
    for uri in [h2_asterisk(Some("app.test")), h2_asterisk(None)] {
        assert_eq!(uri.path(), "*");
        let h = if uri.authority().is_some() {
            h.clone()
        } else {
            headers(&[("host", "app.test")])
        };
        assert_eq!(checked_head(&Method::OPTIONS, v, &uri, &h), Ok(()), "{uri}");
        for method in [Method::GET, Method::POST, Method::DELETE, Method::HEAD] {
            assert_eq!(
                checked_head(&method, v, &uri, &h),
                Err(Invalid::AsteriskForm),
                "{method} {uri}"
            );
        }
    }
    assert!(is_asterisk(&h2_asterisk(Some("app.test"))));
    assert!(is_asterisk(&"*".parse().unwrap()));
    for not in ["/*", "http://app.test/*", "/", "http://app.test"] {
        assert!(!is_asterisk(&not.parse().unwrap()), "{not}");
    }
}

#[test]
fn http2_cookie_fields_become_one_line() {
    let mut h = headers(&[("cookie", "a=1"), ("cookie", "b=2"), ("cookie", "c=3")]);
    join_cookies(&mut h);
    assert_eq!(h.get_all("cookie").iter().count(), 1);
    assert_eq!(h["cookie"], "a=1; b=2; c=3");
    let mut one = headers(&[("cookie", "a=1")]);
    join_cookies(&mut one);
    assert_eq!(one["cookie"], "a=1");
}

/// `holds` answers as a lookup does, whether the map is small enough for
/// its names to be compared one by one or not, for standard and custom
/// names, in any case and with several values.
#[test]
fn holds_answers_as_a_lookup_does_on_either_side_of_its_bound() {
    let asked = [
        X_FORWARDED_FOR.clone(),
        http::header::HOST,
        HeaderName::from_static("x-forwarded-fo"),
        HeaderName::from_static("x-forwarded-forx"),
    ];
    for fields in [
        0,
        1,
        COMPARED_UP_TO - 1,
        COMPARED_UP_TO,
        COMPARED_UP_TO + 1,
        30,
    ] {
        for with in [false, true] {
            let mut map = HeaderMap::new();
            for i in 0..fields {
                let name = HeaderName::from_bytes(format!("x-field-{i}").as_bytes()).unwrap();
                map.append(name, HeaderValue::from_static("v"));
            }
            if with {
                map.append("X-Forwarded-For", HeaderValue::from_static("192.0.2.1"));
                map.append("x-forwarded-for", HeaderValue::from_static("192.0.2.2"));
            }
            for name in &asked {
                assert_eq!(
                    holds(&map, name),
                    map.contains_key(name),
                    "{name} among {fields} fields (x-forwarded-for too: {with})"
                );
            }
            assert_eq!(holds(&map, &X_FORWARDED_FOR), with);
        }
    }
}
