//! A corpus of raw requests (`tests/fixtures/requests/*.req`), each
//! replayed on its own connection to the built binary: what sluice answers,
//! whether it closes the connection, and that nothing it refused reached
//! the upstream.
//!
//! A file is comment lines first (`# ...`), among them
//! `# expect: STATUS... closed|open` (the statuses in order; `closed`: the
//! connection is closed after them; `open`: it still serves, shown by one
//! more request sent after the file's bytes) and optionally
//! `# forwarded: any` (the upstream may have seen the start of a request
//! whose body broke). The request follows, with `\r`, `\n`, `\t`, `\0`,
//! `\\` and `\xNN` escapes; the file's own line breaks are not part of it.

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
    bytes: Vec<u8>,
    statuses: Vec<u16>,
    stays_open: bool,
    any_forwarded: bool,
}

fn corpus() -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/requests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the corpus directory")
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "req"))
        .collect();
    files.sort();
    files.into_iter().map(|file| read_case(&file)).collect()
}

fn read_case(file: &Path) -> Case {
    let text = std::fs::read_to_string(file).expect("a corpus file");
    let mut expect = None;
    let mut any_forwarded = false;
    let mut body = String::new();
    for line in text.lines() {
        match line.strip_prefix("# ") {
            Some(comment) if body.is_empty() => {
                if let Some(e) = comment.strip_prefix("expect: ") {
                    expect = Some(e.to_owned());
                }
                if comment == "forwarded: any" {
                    any_forwarded = true;
                }
            }
            _ => body.push_str(line),
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
    Case {
        file: file.to_owned(),
        bytes: unescape(&body, file),
        statuses,
        stays_open,
        any_forwarded,
    }
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
    for case in &cases {
        let before = upstream.count();
        let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
        let mut bytes = case.bytes.clone();
        let mut expected = case.statuses.clone();
        if case.stays_open {
            bytes.extend_from_slice(CLOSING);
            expected.push(200);
        }
        stream.write_all(&bytes).await.expect("write the request");
        let name = case.file.file_name().unwrap_or_default().to_string_lossy();
        let (answer, closed) = until_closed(&mut stream).await;
        if !closed {
            failures.push(format!(
                "{name}: the connection stayed open after {:?}",
                String::from_utf8_lossy(&answer)
            ));
            continue;
        }
        let got = statuses(&answer);
        if got != expected {
            failures.push(format!(
                "{name}: answered {got:?}, expected {expected:?}: {:?}",
                String::from_utf8_lossy(&answer)
            ));
            continue;
        }
        let served = expected.iter().filter(|s| (200..300).contains(*s)).count();
        let forwarded = upstream.count() - before;
        if forwarded != served && !case.any_forwarded {
            failures.push(format!(
                "{name}: the upstream saw {forwarded} requests for {served} served"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
