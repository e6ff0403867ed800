//! A corpus of requests (`tests/fixtures/requests/`), each replayed on its
//! own connection to the built binary: what sluice answers, whether it
//! closes the connection, and that nothing it refused reached the
//! upstream.
//!
//! A file is comment lines first (`# ...`), among them
//! `# expect: STATUS... closed|open` (the statuses in order; `closed`: the
//! connection is closed after them; `open`: it still serves, shown by one
//! more request sent after the file's) and optionally `# forwarded: any`
//! (the upstream may have seen the start of a request whose body broke) or
//! `# forwarded: none` (sluice answered it itself: its 2xx never reached
//! the upstream).
//!
//! In a `.req` file the HTTP/1 request follows, with `\r`, `\n`, `\t`,
//! `\0`, `\\` and `\xNN` escapes; the file's own line breaks are not part
//! of it. In a `.h2` file, one HTTP/2 request on a prior-knowledge
//! connection: a field a line, `name: value`, the pseudo-header fields
//! first. `:method` and `:path` are required and sent as written (`:path:
//! *` included, which hyper's client cannot write); with `:authority`,
//! `:scheme` (default `http`) is sent beside it, as browsers and curl send
//! a request; without, h2 sends `:scheme: http` alone, and the `Host` the
//! file gives names the server.

use crate::support;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{Sidecar, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sent after a file expecting `open`: it must be served too.
const CLOSING: &[u8] = b"GET /corpus-closing HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n";

#[derive(Debug)]
struct Case {
    file: PathBuf,
    request: Request,
    statuses: Vec<u16>,
    stays_open: bool,
    forwarded: Forwarded,
}

#[derive(Debug)]
enum Request {
    /// The bytes of an HTTP/1 exchange.
    Http1(Vec<u8>),
    /// The fields of one HTTP/2 request, in order.
    Http2(Vec<(String, String)>),
}

/// What the upstream may have seen of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forwarded {
    /// One request per 2xx answer, and nothing else.
    Served,
    /// Anything: a request whose body broke may have started upstream.
    Any,
    /// Nothing: sluice gave every answer itself.
    None,
}

fn corpus() -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/requests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the corpus directory")
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "req" || e == "h2"))
        .collect();
    files.sort();
    files.into_iter().map(|file| read_case(&file)).collect()
}

fn read_case(file: &Path) -> Case {
    let text = std::fs::read_to_string(file).expect("a corpus file");
    let mut expect = None;
    let mut forwarded = Forwarded::Served;
    let mut lines = Vec::new();
    for line in text.lines() {
        match line.strip_prefix("# ") {
            Some(comment) if lines.is_empty() => {
                if let Some(e) = comment.strip_prefix("expect: ") {
                    expect = Some(e.to_owned());
                }
                match comment {
                    "forwarded: any" => forwarded = Forwarded::Any,
                    "forwarded: none" => forwarded = Forwarded::None,
                    _ => {}
                }
            }
            _ => lines.push(line),
        }
    }
    let expect = expect.unwrap_or_else(|| panic!("{}: no `# expect:` line", file.display()));
    let mut words: Vec<&str> = expect.split_whitespace().collect();
    let stays_open = match words.pop() {
        Some("open") => true,
        Some("closed") => false,
        other => panic!(
            "{}: expect must end in closed or open, not {other:?}",
            file.display()
        ),
    };
    let statuses = words
        .iter()
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| panic!("{}: status {w}", file.display()))
        })
        .collect();
    let request = if file.extension().is_some_and(|e| e == "h2") {
        Request::Http2(lines.iter().map(|line| field(line, file)).collect())
    } else {
        Request::Http1(unescape(&lines.concat(), file))
    };
    Case {
        file: file.to_owned(),
        request,
        statuses,
        stays_open,
        forwarded,
    }
}

/// `name: value`; a pseudo-header's name keeps its leading `:`.
fn field(line: &str, file: &Path) -> (String, String) {
    let colon = line
        .get(1..)
        .and_then(|rest| rest.find(':'))
        .unwrap_or_else(|| panic!("{}: not a field: {line:?}", file.display()));
    let (name, value) = line.split_at(colon + 1);
    (name.to_owned(), value[1..].trim().to_owned())
}

fn unescape(text: &str, file: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next() {
            Some('r') => out.push(b'\r'),
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('0') => out.push(0),
            Some('\\') => out.push(b'\\'),
            Some('x') => {
                let hex: String = chars.by_ref().take(2).collect();
                out.push(
                    u8::from_str_radix(&hex, 16)
                        .unwrap_or_else(|_| panic!("{}: bad escape \\x{hex}", file.display())),
                );
            }
            other => panic!("{}: unknown escape \\{other:?}", file.display()),
        }
    }
    out
}

/// Everything sent back, and whether the connection was closed (within
/// 3 s of the last byte).
async fn until_closed(stream: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(3), stream.read(&mut chunk)).await {
            Ok(Ok(0)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&chunk[..n]),
            // A reset after the answer is a close too.
            Ok(Err(_)) => return (out, true),
            Err(_) => return (out, false),
        }
    }
}

/// The status of each response in `bytes`, in order, reading each head's
/// `Content-Length` to step over its body.
fn statuses(bytes: &[u8]) -> Vec<u16> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not a response head: {head:?}"));
        out.push(status);
        let length = support::content_length(&head).unwrap_or(0);
        rest = &rest[(end + 4 + length).min(rest.len())..];
    }
    out
}

fn config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
policies:
  lots: {{ algorithm: sliding-log, limit: 100000, window: 1h }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, subject: client_ip, policy: lots }}
",
        upstream.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_in_the_corpus_gets_its_answer_and_nothing_refused_is_forwarded() {
    let cases = corpus();
    assert!(
        cases.len() >= 30,
        "the corpus is there: {} files",
        cases.len()
    );
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    let mut failures = Vec::new();
    let mut http2 = 0;
    for case in &cases {
        let before = upstream.count();
        let name = case.file.file_name().unwrap_or_default().to_string_lossy();
        let answered = match &case.request {
            Request::Http1(bytes) => http1(&sluice, bytes, case).await,
            Request::Http2(fields) => {
                http2 += 1;
                self::http2(&sluice, fields, case).await
            }
        };
        if let Err(failure) = answered {
            failures.push(format!("{name}: {failure}"));
            continue;
        }
        // The request sent after an `open` case is served by the upstream.
        let served = case
            .statuses
            .iter()
            .filter(|s| (200..300).contains(*s))
            .count();
        let followed = usize::from(case.stays_open);
        let forwarded = upstream.count() - before;
        let expected = match case.forwarded {
            Forwarded::Served => Some(served + followed),
            Forwarded::None => Some(followed),
            Forwarded::Any => None,
        };
        if expected.is_some_and(|expected| forwarded != expected) {
            failures.push(format!(
                "{name}: the upstream saw {forwarded} requests, expected {expected:?} ({:?})",
                case.forwarded
            ));
        }
    }
    assert!(http2 >= 5, "the HTTP/2 cases are there: {http2} files");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An HTTP/1 case: its bytes (and the closing request after an `open`
/// one) on one connection, read until sluice closes it.
async fn http1(sluice: &Sidecar, bytes: &[u8], case: &Case) -> Result<(), String> {
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    let mut bytes = bytes.to_vec();
    let mut expected = case.statuses.clone();
    if case.stays_open {
        bytes.extend_from_slice(CLOSING);
        expected.push(200);
    }
    stream.write_all(&bytes).await.expect("write the request");
    let (answer, closed) = until_closed(&mut stream).await;
    if !closed {
        return Err(format!(
            "the connection stayed open after {:?}",
            String::from_utf8_lossy(&answer)
        ));
    }
    let got = statuses(&answer);
    if got != expected {
        return Err(format!(
            "answered {got:?}, expected {expected:?}: {:?}",
            String::from_utf8_lossy(&answer)
        ));
    }
    Ok(())
}

/// An HTTP/2 case: one stream with the file's fields, then, for an `open`
/// case, a plain GET on the same connection that must be served; for a
/// `closed` one, that GET must find the connection gone.
async fn http2(sluice: &Sidecar, fields: &[(String, String)], case: &Case) -> Result<(), String> {
    let [expected] = case.statuses[..] else {
        return Err(format!(
            "one status per HTTP/2 case, not {:?}",
            case.statuses
        ));
    };
    let request = h2_request(fields)?;
    let tcp = TcpStream::connect(sluice.addr()).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp)
        .await
        .map_err(|e| format!("the HTTP/2 handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let got = h2_status(client.clone(), request).await?;
    if got != expected {
        return Err(format!("answered {got}, expected {expected}"));
    }
    let after = http::Request::get("http://app/corpus-closing")
        .body(())
        .expect("a request");
    match (h2_status(client, after).await, case.stays_open) {
        (Ok(200), true) | (Err(_), false) => Ok(()),
        (other, true) => Err(format!("the connection no longer serves: {other:?}")),
        (other, false) => Err(format!("the connection still serves: {other:?}")),
    }
}

/// The request a `.h2` file describes.
fn h2_request(fields: &[(String, String)]) -> Result<http::Request<()>, String> {
    let pseudo = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let method = pseudo(":method").ok_or("no :method")?;
    let path = pseudo(":path").ok_or("no :path")?;
    let path_and_query =
        http::uri::PathAndQuery::try_from(path).map_err(|e| format!(":path {path:?}: {e}"))?;
    let mut parts = http::uri::Parts::default();
    parts.path_and_query = Some(path_and_query);
    if let Some(authority) = pseudo(":authority") {
        let scheme = pseudo(":scheme").unwrap_or("http");
        parts.scheme = Some(scheme.parse().map_err(|e| format!(":scheme: {e}"))?);
        parts.authority = Some(authority.parse().map_err(|e| format!(":authority: {e}"))?);
    }
    let uri = http::Uri::from_parts(parts).map_err(|e| format!("{path:?}: {e}"))?;
    let mut request = http::Request::builder()
        .method(method)
        .uri(uri)
        // Without `:authority`, the version h2 reads as "translated from
        // HTTP/1", for which it sends `:scheme: http` alone.
        .version(http::Version::HTTP_11);
    for (name, value) in fields.iter().filter(|(n, _)| !n.starts_with(':')) {
        request = request.header(name, value);
    }
    request.body(()).map_err(|e| format!("the request: {e}"))
}

/// The status `request` is answered with; the stream read to its end.
async fn h2_status(
    client: h2::client::SendRequest<bytes::Bytes>,
    request: http::Request<()>,
) -> Result<u16, String> {
    let exchange = async {
        let mut client = client.ready().await.map_err(|e| format!("ready: {e}"))?;
        let (response, _) = client
            .send_request(request, true)
            .map_err(|e| format!("send: {e}"))?;
        let response = response.await.map_err(|e| format!("the response: {e}"))?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| format!("the body: {e}"))?;
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        Ok(status)
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .unwrap_or_else(|_| Err("no answer within 5 s".to_owned()))
}
