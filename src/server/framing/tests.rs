use super::head::Refusal;
use super::*;

/// hyper's bound in these tests.
const MAX_HEAD: usize = 64 * 1024;

/// Feeds `input` in pieces of `step` bytes; returns what hyper would read.
fn through(input: &[u8], step: usize) -> (Vec<u8>, Framing) {
    let (out, framing, _) = through_with_stand_in(input, step);
    (out, framing)
}

/// As [`through`], and the head replaced by the stand-in, if any.
fn through_with_stand_in(input: &[u8], step: usize) -> (Vec<u8>, Framing, Option<u64>) {
    let mut framing = Framing::new(MAX_HEAD);
    let mut out = Vec::new();
    let mut stood_in = None;
    for piece in input.chunks(step.max(1)) {
        let mut piece = piece.to_vec();
        framing.inspect(&mut piece);
        let kept = match framing.take_stand_in() {
            Some((head, kept)) => {
                stood_in = Some(head);
                kept
            }
            None => piece.len(),
        };
        out.extend_from_slice(&piece[..kept]);
    }
    (out, framing, stood_in)
}

/// Every way of cutting `input` into reads gives the same answer.
fn each_split(input: &[u8], check: impl Fn(&[u8], &Framing)) {
    for step in [1, 2, 3, 5, 7, 16, input.len()] {
        let (out, framing) = through(input, step);
        check(&out, &framing);
    }
}

const CL_AND_TE: &[u8] =
    b"POST /login HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";

#[test]
fn content_length_with_transfer_encoding_is_spoiled_where_hyper_has_not_read_it() {
    let head_end = CL_AND_TE.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 3;
    for step in [1, 2, 3, 5, 7, 16, CL_AND_TE.len()] {
        let (out, framing) = through(CL_AND_TE, step);
        assert_eq!(framing.refused(), 1);
        // The head's bytes in the read that completed it are NULs; what
        // hyper had before, and the body after, are untouched.
        let first_spoiled = (head_end / step) * step;
        let mut expected = CL_AND_TE.to_vec();
        expected[first_spoiled..=head_end].fill(0);
        assert_eq!(out, expected, "reads of {step}");
    }
    let (out, _) = through(CL_AND_TE, CL_AND_TE.len());
    assert_eq!(out[0], 0, "read whole: hyper sees no method");
    // Either order, any case, any spacing.
    let other = b"POST / HTTP/1.1\r\ntransfer-encoding:  chunked \r\ncontent-LENGTH:0\r\n\r\n";
    assert_eq!(through(other, 4).1.refused(), 1);
}

#[test]
fn a_bare_line_feed_anywhere_in_the_head_is_refused() {
    for head in [
        &b"GET / HTTP/1.1\nHost: a\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n\n",
        b"GET / HTTP/1.1\n\n",
    ] {
        each_split(head, |out, framing| {
            assert_eq!(framing.refused(), 1, "{:?}", String::from_utf8_lossy(head));
            assert_eq!(out[head.len() - 1], 0);
        });
        assert!(through(head, head.len()).0.iter().all(|&b| b == 0));
    }
}

#[test]
fn a_head_whose_body_cannot_be_framed_is_handed_over_as_the_stand_in() {
    let served = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n";
    for bad in [
        &b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"[..],
        b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding:\r\n\r\n",
        b"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        let what = String::from_utf8_lossy(bad);
        // Whole in one read, behind a request that is served: hyper gets
        // that request, then the stand-in, and nothing after it.
        let mut input = served.to_vec();
        input.extend_from_slice(bad);
        input.extend_from_slice(b"zzzz GET /after HTTP/1.1\r\n\r\n");
        let (out, framing, stood_in) = through_with_stand_in(&input, input.len());
        let mut expected = served.to_vec();
        expected.extend_from_slice(STAND_IN);
        assert_eq!(out, expected, "{what}");
        assert_eq!(stood_in, Some(2), "{what}: the second head");
        assert!(matches!(framing.state, State::Off));
        // Begun in an earlier read, part of it is hyper's already: spoiled.
        let (out, framing, stood_in) = through_with_stand_in(bad, 5);
        assert_eq!(stood_in, None, "{what}");
        assert_eq!(framing.refused(), 1, "{what}");
        assert_eq!(out[bad.len() - 1], 0, "{what}");
    }
    // What hyper frames itself is left alone.
    for good in [
        &b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"[..],
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /x HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
    ] {
        let (out, framing, stood_in) = through_with_stand_in(good, good.len());
        assert_eq!(stood_in, None);
        assert_eq!(framing.refused(), 0);
        assert_eq!(out, good);
    }
}

#[test]
fn well_framed_pipelines_pass_untouched_and_a_bad_head_behind_them_is_caught() {
    let good = b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
GET /b HTTP/1.1\r\nHost: a\r\n\r\n\
POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: t\r\n\r\n\
\r\nGET /d HTTP/1.1\r\nHost: a\r\n\r\n";
    each_split(good, |out, framing| {
        assert_eq!(framing.refused(), 0);
        assert_eq!(out, &good[..]);
        assert!(matches!(framing.state, State::Idle));
    });
    let mut smuggled = good.to_vec();
    smuggled.extend_from_slice(CL_AND_TE);
    each_split(&smuggled, |out, framing| {
        assert_eq!(framing.refused(), 1);
        assert_eq!(&out[..good.len()], &good[..]);
    });
}

#[test]
fn a_body_that_looks_like_a_bad_head_is_only_a_body() {
    let body = b"GET /x HTTP/1.1\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut input =
        format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    input.extend_from_slice(body);
    each_split(&input, |out, framing| {
        assert_eq!(framing.refused(), 0);
        assert_eq!(out, &input[..]);
    });
    let mut chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    chunked.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
    chunked.extend_from_slice(body);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    each_split(&chunked, |out, framing| {
        assert_eq!(framing.refused(), 0);
        assert_eq!(out, &chunked[..]);
    });
}

#[test]
fn what_cannot_be_followed_is_left_to_hyper() {
    for input in [
        // HTTP/2's preface, an upgrade, a tunnel, a chunk size that is no
        // number: nothing after them is inspected.
        &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
        b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ] {
        let mut bytes = input.to_vec();
        bytes.extend_from_slice(CL_AND_TE);
        let (out, framing) = through(&bytes, 3);
        assert_eq!(framing.refused(), 0, "{:?}", String::from_utf8_lossy(input));
        assert_eq!(out, bytes);
        assert!(matches!(framing.state, State::Off));
    }
}

#[test]
fn a_head_past_the_bound_stops_the_watch_however_it_is_read() {
    // Refused when small; past the bound, hyper's 431 instead, whether
    // the head ended within the read that passed the bound or later.
    let mut head =
        b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\nX: ".to_vec();
    head.resize(MAX_HEAD + 10, b'a');
    head.extend_from_slice(b"\r\n\r\n");
    for step in [1, 7, 4096, head.len()] {
        let (out, framing) = through(&head, step);
        assert_eq!(framing.refused(), 0, "reads of {step}");
        assert!(matches!(framing.state, State::Off));
        assert_eq!(out, head);
    }
}

#[test]
fn a_head_too_large_to_follow_stops_the_watch() {
    let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
    head.resize(MAX_HEAD + 10, b'a');
    let (_, framing) = through(&head, 4096);
    assert!(matches!(framing.state, State::Off));
}

// The reader against the whole-head reading it replaced (which kept a
// copy of the head): the same verdict and the same end, however the head
// is cut into reads.

/// Heads built from pieces that exercise every rule: line endings, the
/// three fields in any case and spacing, lengths that do and do not parse.
fn heads() -> Vec<Vec<u8>> {
    let request_lines: [&[u8]; 14] = [
        b"GET / HTTP/1.1",
        b"POST /a?b=c HTTP/1.0",
        b"CONNECT a:443 HTTP/1.1",
        b"connect a:443 HTTP/1.1",
        b"GET  / HTTP/1.1",
        b"GET / HTTP/2.0",
        b"GET /x\ry HTTP/1.1",
        // Beside the one-pass check for a plain head: a space too many or
        // too few, a version almost 1.1, a CR inside the method.
        b"GET /a b HTTP/1.1",
        b"GET HTTP/1.1",
        b" / HTTP/1.1",
        b"GET / HTTP/1.1 ",
        b"GET / HTTP/1.10",
        b"GET / http/1.1",
        b"G\rET / HTTP/1.1",
    ];
    let fields: [&[u8]; 29] = [
        b"Host: a",
        b"Content-Length: 5",
        b"content-length:5 ",
        b"Content-Length: 5",
        b"Content-Length: 6",
        b"Content-Length: 0005",
        b"Content-Length: +5",
        b"Content-Length: 5 5",
        b"Content-Length: 99999999999999999999999",
        b"Content-Length:",
        b"Transfer-Encoding: chunked",
        b"transfer-encoding: gzip, CHUNKED  ",
        b"Transfer-Encoding: chunked, gzip",
        b"Transfer-Encoding: chun ked",
        b"Transfer-Encoding:\tchunked\t",
        b"Transfer-Encoding : chunked",
        b"Upgrade: websocket",
        b"upgrade:",
        b"Cookie: a=b; c=d",
        b"X-Long: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        b"Contentious: x",
        b"no colon here",
        // Beside the three names: a line read whole is passed over only
        // when its name, to the first colon, is none of them.
        b"CONTENT-LENGTH: 5",
        b"Content-Lengthy: 5",
        b"Content-Length : 5",
        b"UPGRADE:h2c",
        b"Upgrade-Insecure-Requests: 1",
        b"upgrade",
        b"Transfer-Encodings: gzip",
    ];
    let endings: [&[u8]; 3] = [b"\r\n", b"\n", b"\r\r\n"];
    let mut heads = Vec::new();
    let mut seed = 7u64;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize % n
    };
    for _ in 0..4000 {
        let mut head = request_lines[next(request_lines.len())].to_vec();
        let ending = |n: usize| if n < 12 { endings[n % 3] } else { endings[0] };
        head.extend_from_slice(ending(next(40)));
        for _ in 0..next(5) {
            head.extend_from_slice(fields[next(fields.len())]);
            head.extend_from_slice(ending(next(40)));
        }
        head.extend_from_slice(ending(next(40)));
        heads.push(head);
    }
    heads
}

#[test]
fn the_reader_gives_the_verdict_of_a_whole_head_however_it_is_cut() {
    let mut ended = 0;
    for head in heads() {
        // Where the blank line is, if there is one, and what it closes.
        let expected = oracle_find_end(&[], &head).map(|end| (end, oracle_read_head(&head[..end])));
        ended += usize::from(expected.is_some());
        for step in [1, 2, 3, 7, head.len()] {
            let mut reader = HeadReader::new();
            let mut got = None;
            for (n, piece) in head.chunks(step).enumerate() {
                if let Some((used, verdict)) = reader.read(piece) {
                    got = Some((n * step + used, verdict));
                    break;
                }
            }
            assert_eq!(
                got,
                expected,
                "{:?} in reads of {step}",
                String::from_utf8_lossy(&head)
            );
            let read = expected.as_ref().map_or(head.len(), |(end, _)| *end);
            assert_eq!(reader.len(), read);
        }
    }
    assert!(ended > 3000, "most heads end: {ended}");
}

/// Where the head ends in `rest`, given the head's last bytes `tail` before
/// it: the count of bytes of `rest` through the blank line's LF.
fn oracle_find_end(tail: &[u8], rest: &[u8]) -> Option<usize> {
    // The byte `back` places before `rest[i]`, looking into `tail` when
    // `rest` does not reach back that far.
    let before = |i: usize, back: usize| -> Option<u8> {
        match i.checked_sub(back) {
            Some(j) => Some(rest[j]),
            None => tail.len().checked_sub(back - i).map(|j| tail[j]),
        }
    };
    let mut from = 0;
    while let Some(found) = rest[from..].iter().position(|&b| b == b'\n') {
        let i = from + found;
        let blank = match before(i, 1) {
            Some(b'\n') => true,
            Some(b'\r') => before(i, 2) == Some(b'\n'),
            _ => false,
        };
        if blank {
            return Some(i + 1);
        }
        from = i + 1;
    }
    None
}

/// Reads a whole head (request line through the blank line).
fn oracle_read_head(head: &[u8]) -> Head {
    // Every line, without its LF; the last is the blank line.
    let body = head.strip_suffix(b"\n").unwrap_or(head);
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut content_length = false;
    let mut unfollowable = false;
    let mut http10 = false;
    for (n, line) in body.split(|&b| b == b'\n').enumerate() {
        let Some(line) = line.strip_suffix(b"\r") else {
            return Head::Refuse(Refusal::BareLineFeed);
        };
        if n == 0 {
            let mut parts = line.split(|&b| b == b' ');
            let method = parts.next().unwrap_or_default();
            let version = parts.nth(1).unwrap_or_default();
            if method == b"CONNECT" || !version.starts_with(b"HTTP/1.") {
                unfollowable = true;
            }
            http10 = version == b"HTTP/1.0";
            continue;
        }
        // Only three names matter; most lines are passed over at their
        // first byte.
        if !matches!(line.first(), Some(b'c' | b'C' | b't' | b'T' | b'u' | b'U')) {
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], oracle_trim(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"content-length") {
            content_length = true;
            // Digits only, as hyper reads a length (`+5` is none).
            let parsed = std::str::from_utf8(value)
                .ok()
                .filter(|v| v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok());
            match (parsed, length) {
                (Some(v), None) => length = Some(v),
                (Some(v), Some(prev)) if v == prev => {}
                // Different or unreadable lengths: hyper refuses those.
                _ => unfollowable = true,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            transfer_encoding = true;
            chunked = value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| oracle_trim(last).eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            unfollowable = true;
        }
    }
    if content_length && transfer_encoding {
        return Head::Refuse(Refusal::ContentLengthAndTransferEncoding);
    }
    if unfollowable {
        return Head::Unfollowable;
    }
    match (transfer_encoding, chunked, length) {
        // No body length can be read from these: hyper refuses them too.
        (true, _, _) if http10 => Head::Refuse(Refusal::UnframedBody),
        (true, true, _) => Head::Chunked,
        (true, false, _) => Head::Refuse(Refusal::UnframedBody),
        (false, _, Some(n)) => Head::Length(n),
        (false, _, None) => Head::Empty,
    }
}

fn oracle_trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &bytes[start..end.max(start)]
}
