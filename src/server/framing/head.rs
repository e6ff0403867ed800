//! One HTTP/1 request head, read as its bytes arrive, never copied.
//!
//! hyper already holds every byte of a head that spans reads in its own
//! buffer; a second copy here would double what a slow client makes
//! sluice hold. So the head is read line by line as it passes, keeping
//! only what the verdict needs: how each line ends, the method and
//! version, and the value of the few fields that decide the framing
//! (`Content-Length`, the last coding of `Transfer-Encoding`, whether
//! `Upgrade` is there), each in a few bytes of fixed size.

/// What a whole head says about the request.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// Refused: hyper must not take it.
    Refuse(Refusal),
    /// Followed by a body of this framing.
    Length(u64),
    Chunked,
    /// No body.
    Empty,
    /// Cannot be followed (an upgrade, `CONNECT`, not HTTP/1).
    Unfollowable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    ContentLengthAndTransferEncoding,
    BareLineFeed,
    /// `Transfer-Encoding` whose last coding is not `chunked`, or on
    /// HTTP/1.0: where the body ends cannot be known (RFC 9112 §6.3).
    /// hyper refuses such a head too, but with a bare 400; sluice answers
    /// it itself, with a problem body.
    UnframedBody,
}

const CONTENT_LENGTH: &[u8] = b"content-length";
const TRANSFER_ENCODING: &[u8] = b"transfer-encoding";
const UPGRADE: &[u8] = b"upgrade";

/// How far [`until`] looks byte by byte before it hands the rest to
/// `memchr`: a method, a version, most field names and a `Host` value end
/// within it, where `memchr`'s setup (about a hundred instructions a
/// call, measured) would cost more than the bytes.
const SHORT: usize = 16;

/// The count of `bytes` before the first one `stop` is true of (all of
/// them if none is): the first [`SHORT`] looked at one by one, the rest
/// searched by `search` (`memchr`, a word or a vector at a time: a
/// browser's head is half a kilobyte of fields that cannot matter here,
/// and a byte loop cost about ten instructions a byte of it).
fn until(
    bytes: &[u8],
    stop: impl Fn(u8) -> bool,
    search: impl Fn(&[u8]) -> Option<usize>,
) -> usize {
    let (near, far) = bytes.split_at(bytes.len().min(SHORT));
    match near.iter().position(|&b| stop(b)) {
        Some(at) => at,
        None => near.len() + search(far).unwrap_or(far.len()),
    }
}

/// Whether a field line (its content, without the line ending) is one of
/// the three fields that decide the framing: its name, up to the first
/// colon, is one of them, case aside.
fn matters(line: &[u8]) -> bool {
    let named = |name: &[u8]| {
        line.get(name.len()) == Some(&b':')
            && line
                .get(..name.len())
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
    };
    named(CONTENT_LENGTH) || named(TRANSFER_ENCODING) || named(UPGRADE)
}

/// The count of `bytes` through the blank line's LF, when they begin with
/// a whole head that has no body and could not be read two ways: a
/// request line `METHOD SP TARGET SP HTTP/1.1`, the method not `CONNECT`,
/// every line ending in CRLF, none of the three fields that decide the
/// framing. Most requests are such a head, arriving in one read; checking
/// that in one pass, a line at a time, costs a fraction of reading it byte
/// by byte. `None` for anything else, which [`HeadReader::read`] then
/// reads from its first byte, as it would have: the verdict is the same
/// either way (the reader's tests compare both with an oracle).
fn plain(bytes: &[u8]) -> Option<usize> {
    const VERSION: &[u8] = b" HTTP/1.1\r";
    let mut ends = memchr::memchr_iter(b'\n', bytes);
    let request = &bytes[..ends.next()?];
    let (method, rest) = request.split_at(request.iter().position(|&b| b == b' ')?);
    let target = rest.get(1..)?.strip_suffix(VERSION)?;
    if method == b"CONNECT" || target.contains(&b' ') {
        return None;
    }
    let mut start = request.len() + 1;
    for end in ends {
        let content = bytes[start..end].strip_suffix(b"\r")?;
        if content.is_empty() {
            return Some(end + 1);
        }
        if matters(content) {
            return None;
        }
        start = end + 1;
    }
    None
}

/// A head being read: everything kept is of fixed size.
#[derive(Debug, Clone)]
pub struct HeadReader {
    /// Bytes of the head so far (what hyper holds of it).
    len: usize,
    /// The line being read is the request line.
    first_line: bool,
    /// Bytes of the current line so far, its LF aside.
    line_len: usize,
    /// A CR that may be the one ending the line: held back until the next
    /// byte says whether it is.
    cr: bool,
    line: Line,
    bare_lf: bool,
    content_length: bool,
    length: Option<u64>,
    transfer_encoding: bool,
    chunked: bool,
    unfollowable: bool,
    /// The request line says HTTP/1.0, which has no transfer-codings.
    http10: bool,
}

/// What the current line is being read as.
#[derive(Debug, Clone)]
enum Line {
    /// The request line: which space-separated part (method 0, target 1,
    /// version 2, ...) and the first bytes of the method and the version.
    Request {
        part: usize,
        method: Small<8>,
        version: Small<8>,
    },
    /// A field line's name, up to its colon.
    Name(Small<17>),
    /// The value of a field that does not matter here, or a line with no
    /// colon.
    Skip,
    ContentLength(Number),
    /// The last comma-separated coding so far, leading whitespace left
    /// out, a run of inner or trailing whitespace kept as one space.
    TransferEncoding {
        coding: Small<8>,
        space: bool,
    },
}

/// A `Content-Length` value read digit by digit: `None` once it cannot be
/// a length (overflow, a byte that is no digit, digits after a space).
#[derive(Debug, Clone, Copy)]
struct Number {
    value: Option<u64>,
    digits: bool,
    ended: bool,
}

/// The first `N` bytes of something, and its whole length.
#[derive(Debug, Clone, Copy)]
struct Small<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> Small<N> {
    const EMPTY: Small<N> = Small {
        bytes: [0; N],
        len: 0,
    };

    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.bytes.get_mut(self.len) {
            *slot = byte;
        }
        self.len += 1;
    }

    fn extend(&mut self, bytes: &[u8]) {
        let room = N.saturating_sub(self.len).min(bytes.len());
        if let (Some(slots), Some(taken)) = (
            self.bytes.get_mut(self.len..self.len + room),
            bytes.get(..room),
        ) {
            slots.copy_from_slice(taken);
        }
        self.len += bytes.len();
    }

    /// Equal to `other` in whole (`other` no longer than `N`).
    fn is(&self, other: &[u8]) -> bool {
        self.len == other.len()
            && self
                .bytes
                .get(..self.len)
                .is_some_and(|bytes| bytes.eq_ignore_ascii_case(other))
    }

    /// Equal to `other`, byte for byte.
    fn equals(&self, other: &[u8]) -> bool {
        self.len == other.len() && self.bytes.get(..self.len) == Some(other)
    }

    /// Begins with `prefix`, byte for byte.
    fn starts_with(&self, prefix: &[u8]) -> bool {
        self.len >= prefix.len() && self.bytes.get(..prefix.len()) == Some(prefix)
    }
}

impl Default for HeadReader {
    fn default() -> Self {
        HeadReader::new()
    }
}

impl HeadReader {
    pub fn new() -> HeadReader {
        HeadReader {
            len: 0,
            first_line: true,
            line_len: 0,
            cr: false,
            line: Line::Request {
                part: 0,
                method: Small::EMPTY,
                version: Small::EMPTY,
            },
            bare_lf: false,
            content_length: false,
            length: None,
            transfer_encoding: false,
            chunked: false,
            unfollowable: false,
            http10: false,
        }
    }

    /// Bytes of the head read so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Reads `bytes`, the head's next ones; the count of them that ends
    /// the head (through the blank line's LF) and its verdict, or `None`
    /// when the head goes on past them.
    pub fn read(&mut self, bytes: &[u8]) -> Option<(usize, Head)> {
        if self.len == 0 {
            if let Some(used) = plain(bytes) {
                self.len = used;
                return Some((used, Head::Empty));
            }
        }
        let mut i = 0;
        while let Some(&byte) = bytes.get(i) {
            // Whole field lines that cannot matter (most of a head), a
            // line at a time, to the blank line if it is among them.
            let (lines, ended) = self.lines(&bytes[i..]);
            if ended {
                return Some((i + lines, self.verdict()));
            }
            if lines > 0 {
                i += lines;
                continue;
            }
            // Bytes that cannot change the verdict (most of a head: the
            // target, every field but three) are passed over in a run,
            // minding only whether the last of them is a CR.
            let run = self.run(&bytes[i..]);
            if run > 0 {
                self.len += run;
                self.line_len += run;
                self.cr = bytes[i + run - 1] == b'\r';
                i += run;
                continue;
            }
            // A field name all in these bytes is read at once, to its colon.
            let name = self.name(&bytes[i..]);
            if name > 0 {
                self.len += name;
                self.line_len += name;
                i += name;
                continue;
            }
            // The method and the version are kept, a run of them at once.
            let word = self.word(&bytes[i..]);
            if word > 0 {
                if self.cr {
                    self.content(b'\r');
                    self.cr = false;
                }
                if let Line::Request {
                    part,
                    method,
                    version,
                } = &mut self.line
                {
                    let kept = if *part == 0 { method } else { version };
                    kept.extend(&bytes[i..i + word]);
                }
                self.len += word;
                self.line_len += word;
                i += word;
                continue;
            }
            self.len += 1;
            i += 1;
            if byte != b'\n' {
                if self.cr {
                    // The CR held back was inside the line.
                    self.content(b'\r');
                }
                self.cr = byte == b'\r';
                if !self.cr {
                    self.content(byte);
                }
                self.line_len += 1;
                continue;
            }
            if !self.cr {
                self.bare_lf = true;
            }
            // A line with nothing but its line ending is the blank one.
            let blank = self.line_len == usize::from(self.cr);
            if blank && !self.first_line {
                return Some((i, self.verdict()));
            }
            self.end_line();
        }
        None
    }

    /// At the start of a field line, the count of `rest`'s first bytes
    /// that are whole field lines none of the three fields, read a line at
    /// a time (one `memchr` search for the lot, where a line read by
    /// [`HeadReader::name`] and [`HeadReader::run`] costs two), and whether
    /// the blank line that ends the head is the last of them. Stops before
    /// a line that is one of the three, or that does not end in `rest`:
    /// those are read byte by byte.
    fn lines(&mut self, rest: &[u8]) -> (usize, bool) {
        if self.first_line || self.cr || !matches!(&self.line, Line::Name(name) if name.len == 0) {
            return (0, false);
        }
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', rest) {
            let line = &rest[start..end];
            let (content, bare) = match line.split_last() {
                Some((b'\r', content)) => (content, false),
                _ => (line, true),
            };
            if matters(content) {
                break;
            }
            self.bare_lf |= bare;
            start = end + 1;
            if content.is_empty() {
                self.len += start;
                return (start, true);
            }
        }
        self.len += start;
        (start, false)
    }

    /// How many of `rest`'s first bytes may be passed over: up to the
    /// line's end in a line that cannot matter, up to the next space in
    /// the request target.
    fn run(&self, rest: &[u8]) -> usize {
        match self.line {
            Line::Skip => until(rest, |b| b == b'\n', |r| memchr::memchr(b'\n', r)),
            Line::Request { part: 1, .. } => until(
                rest,
                |b| b == b' ' || b == b'\n',
                |r| memchr::memchr2(b' ', b'\n', r),
            ),
            _ => 0,
        }
    }

    /// At the start of a field line, the count of `rest`'s first bytes
    /// that are its name and colon, read as one, when the colon comes
    /// before any CR or LF; else 0, and the name is read a byte at a time
    /// (split across reads, or a line with no colon). Either way the line
    /// is then read as [`HeadReader::after_name`] says.
    fn name(&mut self, rest: &[u8]) -> usize {
        if self.cr || !matches!(&self.line, Line::Name(name) if name.len == 0) {
            return 0;
        }
        let end = until(
            rest,
            |b| b == b':' || b == b'\r' || b == b'\n',
            |r| memchr::memchr3(b':', b'\r', b'\n', r),
        );
        if rest.get(end) != Some(&b':') {
            return 0;
        }
        let name = &rest[..end];
        self.line = self.after_name(|known| name.eq_ignore_ascii_case(known));
        end + 1
    }

    /// What the rest of a field line is read as, given its name (`is`
    /// tells whether it is a name, case aside).
    fn after_name(&mut self, is: impl Fn(&[u8]) -> bool) -> Line {
        if is(CONTENT_LENGTH) {
            self.content_length = true;
            Line::ContentLength(Number {
                value: Some(0),
                digits: false,
                ended: false,
            })
        } else if is(TRANSFER_ENCODING) {
            self.transfer_encoding = true;
            Line::TransferEncoding {
                coding: Small::EMPTY,
                space: false,
            }
        } else {
            if is(UPGRADE) {
                self.unfollowable = true;
            }
            Line::Skip
        }
    }

    /// How many of `rest`'s first bytes are the method's or the version's
    /// (no space, CR or LF among them).
    fn word(&self, rest: &[u8]) -> usize {
        match self.line {
            Line::Request { part: 0 | 2, .. } => until(
                rest,
                |b| b == b' ' || b == b'\r' || b == b'\n',
                |r| memchr::memchr3(b' ', b'\r', b'\n', r),
            ),
            _ => 0,
        }
    }

    /// One byte of a line's content (its final CR and LF aside).
    fn content(&mut self, byte: u8) {
        match &mut self.line {
            Line::Request {
                part,
                method,
                version,
            } => match (byte, *part) {
                (b' ', _) => *part += 1,
                (_, 0) => method.push(byte),
                (_, 2) => version.push(byte),
                _ => {}
            },
            Line::Name(name) => {
                if byte != b':' {
                    // Only names beginning so can be one of the three.
                    let first = name.len == 0;
                    name.push(byte);
                    if first && !matches!(byte, b'c' | b'C' | b't' | b'T' | b'u' | b'U')
                        || name.len > TRANSFER_ENCODING.len()
                    {
                        self.line = Line::Skip;
                    }
                    return;
                }
                let name = *name;
                self.line = self.after_name(|known| name.is(known));
            }
            Line::Skip => {}
            Line::ContentLength(number) => number.push(byte),
            Line::TransferEncoding { coding, space } => match byte {
                b',' => {
                    *coding = Small::EMPTY;
                    *space = false;
                }
                b' ' | b'\t' => *space = coding.len > 0,
                _ => {
                    if std::mem::take(space) {
                        coding.push(b' ');
                    }
                    coding.push(byte);
                }
            },
        }
    }

    /// The line just ended (at its LF).
    fn end_line(&mut self) {
        match &self.line {
            Line::Request {
                method, version, ..
            } => {
                if method.equals(b"CONNECT") || !version.starts_with(b"HTTP/1.") {
                    self.unfollowable = true;
                }
                self.http10 = version.equals(b"HTTP/1.0");
            }
            Line::ContentLength(number) => match (number.length(), self.length) {
                (Some(v), None) => self.length = Some(v),
                (Some(v), Some(prev)) if v == prev => {}
                // Different or unreadable lengths: hyper refuses those.
                _ => self.unfollowable = true,
            },
            Line::TransferEncoding { coding, .. } => {
                // The last field's last coding decides.
                self.chunked = coding.is(b"chunked");
            }
            Line::Name(_) | Line::Skip => {}
        }
        self.first_line = false;
        self.line_len = 0;
        self.cr = false;
        self.line = Line::Name(Small::EMPTY);
    }

    fn verdict(&self) -> Head {
        if self.bare_lf {
            return Head::Refuse(Refusal::BareLineFeed);
        }
        if self.content_length && self.transfer_encoding {
            return Head::Refuse(Refusal::ContentLengthAndTransferEncoding);
        }
        if self.unfollowable {
            return Head::Unfollowable;
        }
        match (self.transfer_encoding, self.chunked, self.length) {
            (true, _, _) if self.http10 => Head::Refuse(Refusal::UnframedBody),
            (true, true, _) => Head::Chunked,
            (true, false, _) => Head::Refuse(Refusal::UnframedBody),
            (false, _, Some(n)) => Head::Length(n),
            (false, _, None) => Head::Empty,
        }
    }
}

impl Number {
    fn push(&mut self, byte: u8) {
        match byte {
            b' ' | b'\t' => self.ended = self.digits,
            b'0'..=b'9' if !self.ended => {
                let digit = u64::from(byte - b'0');
                self.value = self
                    .value
                    .and_then(|v| v.checked_mul(10))
                    .and_then(|v| v.checked_add(digit));
                self.digits = true;
            }
            _ => self.value = None,
        }
    }

    fn length(&self) -> Option<u64> {
        self.value.filter(|_| self.digits)
    }
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn a_plain_head_is_checked_in_one_pass_and_nothing_else_is() {
        let head = b"GET /a?b HTTP/1.1\r\nHost: a\r\nUser-Agent: b\r\n\r\n";
        assert_eq!(plain(head), Some(head.len()));
        let mut pipelined = head.to_vec();
        pipelined.extend_from_slice(b"POST / HTTP/1.1\r\n");
        assert_eq!(plain(&pipelined), Some(head.len()));
        for other in [
            &b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\ntransfer-encoding:chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nUPGRADE: h2c\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\n\r\n",
            b"GET / HTTP/1.1\nHost: a\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\n",
        ] {
            assert_eq!(plain(other), None, "{:?}", String::from_utf8_lossy(other));
        }
    }
}
