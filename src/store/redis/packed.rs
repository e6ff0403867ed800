//! A script's call as Redis reads it (RESP2: `*<count>` then each argument
//! as `$<length>` and its bytes), written once, when the call is made.
//!
//! A decision went out as a redis-rs `Cmd`: two vectors allocated for its
//! arguments, then every argument copied again, with its length, into the
//! connection's buffer, about 1,300 instructions a decision. A [`Packed`]
//! is the bytes the connection sends, in one vector, and goes into the
//! connection's buffer with one copy (`Wire::call_packed`). The rare
//! paths read its arguments back: a re-send, the same call as a cached
//! script, its key for a reload, and redis-rs's connections (a Unix
//! socket, TLS without hostname checks, RESP3, Cluster), which take a
//! `Cmd` ([`Packed::to_cmd`]).

use redis::Cmd;

/// Room kept before the arguments for the `*<count>` line, written once
/// the count is known: `*`, up to twenty digits, CRLF.
const ROOM: usize = 24;

/// A command, packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// `resp[start..]` is the command.
    resp: Vec<u8>,
    start: usize,
}

/// Writes a command's arguments, in order.
pub struct Packer {
    resp: Vec<u8>,
    count: usize,
}

impl Packer {
    /// A command whose arguments take about `bytes` bytes, their length
    /// lines included: reserved at once, so no argument moves them.
    pub fn with_capacity(bytes: usize) -> Packer {
        let mut resp = Vec::with_capacity(ROOM + bytes);
        resp.resize(ROOM, 0);
        Packer { resp, count: 0 }
    }

    /// The next argument.
    pub fn arg(&mut self, bytes: &[u8]) -> &mut Packer {
        self.arg_of(&[bytes])
    }

    /// `count` arguments packed already ([`Packed::args_bytes`]).
    pub fn packed(&mut self, args: &[u8], count: usize) -> &mut Packer {
        self.resp.extend_from_slice(args);
        self.count += count;
        self
    }

    /// The next argument, an integer in decimal.
    pub fn int(&mut self, n: u64) -> &mut Packer {
        let mut digits = itoa::Buffer::new();
        self.arg(digits.format(n).as_bytes())
    }

    /// The next argument, made of `parts` one after the other (a record's
    /// key: its state's key, `:e:`, the id), written without a copy of its
    /// own.
    pub fn arg_of(&mut self, parts: &[&[u8]]) -> &mut Packer {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        self.resp.push(b'$');
        self.digits(len);
        for part in parts {
            self.resp.extend_from_slice(part);
        }
        self.resp.extend_from_slice(b"\r\n");
        self.count += 1;
        self
    }

    /// `n` and CRLF. Byte by byte: a length has one to three digits, and
    /// a copy of a slice that short costs a call.
    fn digits(&mut self, n: usize) {
        let digit = |d: usize| b'0' + (d % 10) as u8;
        match n {
            0..=9 => self.resp.push(digit(n)),
            10..=99 => self.resp.extend_from_slice(&[digit(n / 10), digit(n)]),
            100..=999 => self
                .resp
                .extend_from_slice(&[digit(n / 100), digit(n / 10), digit(n)]),
            _ => {
                let mut digits = itoa::Buffer::new();
                self.resp.extend_from_slice(digits.format(n).as_bytes());
            }
        }
        self.resp.extend_from_slice(b"\r\n");
    }

    /// The command: its count, then the arguments written.
    pub fn finish(self) -> Packed {
        let mut digits = itoa::Buffer::new();
        let count = digits.format(self.count).as_bytes();
        let mut resp = self.resp;
        // `*`, the count, CRLF, ending where the first argument begins.
        let start = ROOM - count.len() - 3;
        resp[start] = b'*';
        resp[start + 1..ROOM - 2].copy_from_slice(count);
        resp[ROOM - 2..ROOM].copy_from_slice(b"\r\n");
        Packed { resp, start }
    }
}

impl Packed {
    /// The bytes Redis reads.
    pub fn bytes(&self) -> &[u8] {
        &self.resp[self.start..]
    }

    /// Its arguments as they are packed, without the count line before
    /// them: what [`Packer::packed`] takes.
    pub fn args_bytes(&self) -> &[u8] {
        &self.resp[ROOM..]
    }

    /// Its arguments, in order.
    pub fn args(&self) -> Args<'_> {
        // The count line: its value is not needed, the arguments end with
        // the bytes.
        let rest = self.bytes();
        let first = rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(rest.len(), |i| i + 1);
        Args {
            rest: &rest[first..],
        }
    }

    /// Its first argument (the command's name), and the rest.
    pub fn name(&self) -> (&[u8], Args<'_>) {
        let mut args = self.args();
        (args.next().unwrap_or_default(), args)
    }

    /// The same command as redis-rs's, for its connections.
    pub fn to_cmd(&self) -> Cmd {
        let mut cmd = Cmd::with_capacity(12, self.resp.len());
        for arg in self.args() {
            cmd.arg(arg);
        }
        cmd
    }
}

/// The arguments of a [`Packed`].
pub struct Args<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Args<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        // `$<len>\r\n<bytes>\r\n`, as `Packer::arg_of` wrote it.
        let line = self.rest.iter().position(|&b| b == b'\r')?;
        let len = self.rest.get(1..line)?.iter().try_fold(0usize, |len, &d| {
            let d = d.checked_sub(b'0').filter(|d| *d < 10)?;
            len.checked_mul(10)?.checked_add(usize::from(d))
        })?;
        let start = line + 2;
        let arg = self.rest.get(start..start + len)?;
        self.rest = self.rest.get(start + len + 2..).unwrap_or_default();
        Some(arg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(args: &[&[u8]]) -> Packed {
        let mut packer = Packer::with_capacity(8);
        for arg in args {
            packer.arg(arg);
        }
        packer.finish()
    }

    #[test]
    fn a_command_is_packed_byte_for_byte_as_redis_rs_packs_it() {
        let long = vec![b'x'; 1000];
        let cases: &[&[&[u8]]] = &[
            &[b"PING"],
            &[b"FCALL", b"sl_1", b"2", b"k", b"k:e:1", b"1", b"00ab", b"1"],
            // Empty, binary, CRLF inside, and a length of four digits.
            &[b"SET", b"", b"\r\n\0\xff", &long],
        ];
        for args in cases {
            let mut cmd = Cmd::new();
            for arg in *args {
                cmd.arg(*arg);
            }
            let ours = packed(args);
            assert_eq!(ours.bytes(), &cmd.get_packed_command()[..]);
            assert_eq!(ours.args().collect::<Vec<_>>(), *args);
            assert_eq!(ours.to_cmd().get_packed_command(), cmd.get_packed_command());
        }
    }

    #[test]
    fn a_count_of_several_digits_fits_before_the_arguments() {
        let args: Vec<Vec<u8>> = (0..1234).map(|i| i.to_string().into_bytes()).collect();
        let mut packer = Packer::with_capacity(0);
        let mut cmd = Cmd::new();
        for arg in &args {
            packer.arg(arg);
            cmd.arg(arg);
        }
        packer.int(u64::MAX).arg_of(&[b"ab", b":e:", b"cd"]);
        cmd.arg(u64::MAX).arg("ab:e:cd");
        let ours = packer.finish();
        assert_eq!(ours.bytes(), &cmd.get_packed_command()[..]);
        let (name, mut rest) = ours.name();
        assert_eq!((name, rest.next()), (&b"0"[..], Some(&b"1"[..])));
        assert_eq!(ours.args().count(), 1236);
    }
}
