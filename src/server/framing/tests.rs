use super::*;

/// Feeds `input` in pieces of `step` bytes; returns what hyper would read.
fn through(input: &[u8], step: usize) -> (Vec<u8>, Framing) {
    let mut framing = Framing::new();
    let mut out = input.to_vec();
    for piece in out.chunks_mut(step.max(1)) {
        framing.inspect(piece);
    }
    (out, framing)
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
fn well_framed_pipelines_pass_untouched_and_a_bad_head_behind_them_is_caught() {
    let good = b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
GET /b HTTP/1.1\r\nHost: a\r\n\r\n\
POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: t\r\n\r\n\
\r\nGET /d HTTP/1.1\r\nHost: a\r\n\r\n";
    each_split(good, |out, framing| {
        assert_eq!(framing.refused(), 0);
        assert_eq!(out, &good[..]);
        assert_eq!(framing.state, State::Idle);
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
        assert_eq!(framing.state, State::Off);
    }
}

#[test]
fn a_head_too_large_to_follow_stops_the_watch() {
    let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
    head.resize(MAX_HEAD + 10, b'a');
    let (_, framing) = through(&head, 4096);
    assert_eq!(framing.state, State::Off);
}
