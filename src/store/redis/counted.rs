//! What sluice sends to Redis, counted as it goes on the wire:
//! `sluice_redis_calls_total{command, result}` and
//! `sluice_redis_call_duration_seconds{command}`.
//!
//! Every connection a lane holds, of every topology, is a [`Counted`]
//! one: whatever sends a command through it (a decision, its retry, a
//! lease's grant or return, a refund, the breaker's probe, `POST
//! /explain`'s read-only call, the reload of a missing script, the
//! `TOUCH`es of denied subjects, the libraries' own bookkeeping), it is
//! counted once, by command, when its reply comes or the wait for it ends.
//! Not counted: what a connection says while it opens (`AUTH`, `SELECT`,
//! `HELLO`, `CLIENT SETINFO`) and what redis-rs's cluster client asks on
//! its own (`CLUSTER SLOTS`, the re-sends of a `MOVED` or `ASK`).
//! So on a single node, for the commands named, the counter equals what
//! Redis's `INFO commandstats` counts as `calls` from this sidecar.

use std::sync::Arc;

use metrics::{Counter, Histogram};
use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::RoutingInfo;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::time::Instant;

use crate::telemetry::{REDIS_CALLS, REDIS_CALL_DURATION};

use super::packed::Packed;
use super::shards::Shards;
use super::wire::{Frame, Wire};

/// The `command` label: what Redis names the command, folded to the
/// commands sluice sends on a request's path; the rest is `other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `FCALL` (and `FCALL_RO`): a script run as a Functions library.
    Fcall,
    /// `EVALSHA` (and `EVALSHA_RO`): a script run from the script cache.
    Evalsha,
    FunctionLoad,
    ScriptLoad,
    Touch,
    /// The libraries' bookkeeping (`SET` and `GET` of their leases,
    /// `FUNCTION LIST`, `FUNCTION DELETE`) and anything else.
    Other,
}

impl Command {
    pub const ALL: [Command; 6] = [
        Command::Fcall,
        Command::Evalsha,
        Command::FunctionLoad,
        Command::ScriptLoad,
        Command::Touch,
        Command::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Command::Fcall => "fcall",
            Command::Evalsha => "evalsha",
            Command::FunctionLoad => "function_load",
            Command::ScriptLoad => "script_load",
            Command::Touch => "touch",
            Command::Other => "other",
        }
    }

    /// Read from the command's name (and subcommand).
    pub fn of(cmd: &Cmd) -> Command {
        let mut args = cmd.args_iter().map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes,
            // A cursor or whatever redis-rs adds: never a command's name.
            _ => b"",
        });
        let name = args.next().unwrap_or_default();
        Command::named(name, || args.next().unwrap_or_default())
    }

    /// A command whose first word is `name`, `sub` its second (read only
    /// when the name has subcommands).
    pub fn named<'a>(name: &[u8], sub: impl FnOnce() -> &'a [u8]) -> Command {
        let is = |word: &[u8], what: &str| word.eq_ignore_ascii_case(what.as_bytes());
        if is(name, "FCALL") || is(name, "FCALL_RO") {
            Command::Fcall
        } else if is(name, "EVALSHA") || is(name, "EVALSHA_RO") {
            Command::Evalsha
        } else if is(name, "TOUCH") {
            Command::Touch
        } else if is(name, "FUNCTION") || is(name, "SCRIPT") {
            match is(sub(), "LOAD") {
                true if is(name, "FUNCTION") => Command::FunctionLoad,
                true => Command::ScriptLoad,
                false => Command::Other,
            }
        } else {
            Command::Other
        }
    }
}

/// The `result` label: how the call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    /// Redis answered, not with an error.
    Ok,
    /// Redis answered with an error (function not found, `NOSCRIPT`,
    /// `OOM`, `READONLY`, `NOPERM`, a script's own error...).
    Error,
    /// Sent, and no reply came in the time it was given (the decision's
    /// deadline, a refund's budget, the touches' second), or the request
    /// waiting for it went away.
    Timeout,
    /// Sent, or about to be, when the connection failed: no reply.
    ConnectionLost,
}

impl CallResult {
    pub const ALL: [CallResult; 4] = [
        CallResult::Ok,
        CallResult::Error,
        CallResult::Timeout,
        CallResult::ConnectionLost,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CallResult::Ok => "ok",
            CallResult::Error => "error",
            CallResult::Timeout => "timeout",
            CallResult::ConnectionLost => "connection_lost",
        }
    }

    fn of_error(error: &RedisError) -> CallResult {
        match error.code() {
            Some(_) => CallResult::Error,
            None => CallResult::ConnectionLost,
        }
    }

    /// A reply read in place: an error reply is a frame like any other.
    fn of_frame(reply: &RedisResult<Frame>) -> CallResult {
        match reply {
            Ok(frame) if frame.is_error() => CallResult::Error,
            Ok(_) => CallResult::Ok,
            Err(e) => CallResult::of_error(e),
        }
    }

    fn of_value(value: &Value) -> CallResult {
        match value {
            Value::ServerError(_) => CallResult::Error,
            _ => CallResult::Ok,
        }
    }
}

/// The handles, registered once per store: every series at 0 from the
/// start.
pub struct Calls {
    /// Indexed by [`Command`], then [`CallResult`].
    calls: [[Counter; CallResult::ALL.len()]; Command::ALL.len()],
    duration: [Histogram; Command::ALL.len()],
}

impl Calls {
    pub fn new() -> Arc<Calls> {
        Arc::new(Calls {
            calls: Command::ALL.map(|command| {
                CallResult::ALL.map(|result| {
                    metrics::counter!(REDIS_CALLS, "command" => command.label(), "result" => result.label())
                })
            }),
            duration: Command::ALL.map(|command| {
                crate::telemetry::histogram(REDIS_CALL_DURATION, &[("command", command.label())])
            }),
        })
    }

    fn count(&self, command: Command, result: CallResult, calls: u64) {
        self.calls[command as usize][result as usize].increment(calls);
    }
}

/// One round trip under way: counted when it ends, or as
/// [`CallResult::Timeout`] when dropped first (a deadline cut it short).
struct Trip<'a> {
    calls: &'a Calls,
    started: Instant,
    /// What the trip carries: one command, or a pipeline's.
    commands: smallvec::SmallVec<[Command; 1]>,
    ended: bool,
}

impl<'a> Trip<'a> {
    fn start(calls: &'a Calls, commands: impl IntoIterator<Item = Command>) -> Trip<'a> {
        Trip {
            calls,
            started: Instant::now(),
            commands: commands.into_iter().collect(),
            ended: false,
        }
    }

    /// Every command of the trip ended as `result`.
    fn end(mut self, result: CallResult) {
        self.record(|_| result);
    }

    /// Each command of a pipeline by its own reply.
    fn end_each(mut self, results: impl Fn(usize) -> CallResult) {
        self.record(results);
    }

    fn record(&mut self, results: impl Fn(usize) -> CallResult) {
        self.ended = true;
        for (i, &command) in self.commands.iter().enumerate() {
            self.calls.count(command, results(i), 1);
        }
        // One sample a round trip, under its first command.
        if let Some(&first) = self.commands.first() {
            self.calls.duration[first as usize].record(self.started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Trip<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.record(|_| CallResult::Timeout);
        }
    }
}

/// A connection whose every command is counted.
#[derive(Clone)]
pub struct Counted<C> {
    conn: C,
    calls: Arc<Calls>,
}

impl<C> Counted<C> {
    pub fn new(conn: C, calls: Arc<Calls>) -> Counted<C> {
        Counted { conn, calls }
    }

    /// The trip of a packed command, counted under its name.
    fn packed_trip(&self, cmd: &Packed) -> Trip<'_> {
        let (name, mut rest) = cmd.name();
        let command = Command::named(name, || rest.next().unwrap_or_default());
        Trip::start(&self.calls, [command])
    }
}

impl Counted<Wire> {
    /// [`Wire::call_packed`], counted: an error reply is a frame like any
    /// other.
    pub async fn call_packed(&self, cmd: &Packed) -> RedisResult<Frame> {
        let trip = self.packed_trip(cmd);
        let reply = self.conn.call_packed(cmd).await;
        trip.end(CallResult::of_frame(&reply));
        reply
    }
}

impl Counted<Shards> {
    /// [`Shards::call_packed`], counted once however many redirects it
    /// followed: an error reply is a frame like any other.
    pub async fn call_packed(&self, cmd: &Packed) -> RedisResult<Frame> {
        let trip = self.packed_trip(cmd);
        let reply = self.conn.call_packed(cmd).await;
        trip.end(CallResult::of_frame(&reply));
        reply
    }

    /// [`Shards::call_for_key`], counted.
    pub async fn call_for_key(&self, cmd: &Cmd, key: &[u8]) -> RedisResult<Frame> {
        let trip = Trip::start(&self.calls, [Command::of(cmd)]);
        let reply = self.conn.call_for_key(cmd, key).await;
        trip.end(CallResult::of_frame(&reply));
        reply
    }

    /// [`Shards::call_primaries`], counted once however many nodes it
    /// goes to.
    pub async fn call_primaries(&self, cmd: &Cmd) -> RedisResult<Value> {
        let trip = Trip::start(&self.calls, [Command::of(cmd)]);
        let reply = self.conn.call_primaries(cmd).await;
        trip.end(match &reply {
            Ok(value) => CallResult::of_value(value),
            Err(e) => CallResult::of_error(e),
        });
        reply
    }
}

impl Counted<ClusterConnection> {
    /// [`ClusterConnection::route_command`], counted once however many
    /// nodes it goes to.
    pub async fn route_command(&mut self, cmd: Cmd, routing: RoutingInfo) -> RedisResult<Value> {
        let trip = Trip::start(&self.calls, [Command::of(&cmd)]);
        let reply = self.conn.route_command(cmd, routing).await;
        trip.end(match &reply {
            Ok(value) => CallResult::of_value(value),
            Err(e) => CallResult::of_error(e),
        });
        reply
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Counted<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let trip = Trip::start(&self.calls, [Command::of(cmd)]);
            let reply = self.conn.req_packed_command(cmd).await;
            trip.end(match &reply {
                Ok(value) => CallResult::of_value(value),
                Err(e) => CallResult::of_error(e),
            });
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let trip = Trip::start(&self.calls, pipeline.cmd_iter().map(Command::of));
            let replies = self.conn.req_packed_commands(pipeline, offset, count).await;
            match &replies {
                // Only the replies from `offset` on come back: the ones
                // before are a transaction's `MULTI` and queued answers.
                Ok(values) => trip.end_each(|i| {
                    i.checked_sub(offset)
                        .and_then(|i| values.get(i))
                        .map_or(CallResult::Ok, CallResult::of_value)
                }),
                Err(e) => trip.end(CallResult::of_error(e)),
            }
            replies
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_read_from_their_name_and_subcommand() {
        let of = |args: &[&str]| {
            let mut cmd = redis::cmd(args[0]);
            for arg in &args[1..] {
                cmd.arg(*arg);
            }
            Command::of(&cmd)
        };
        assert_eq!(of(&["FCALL", "f", "1", "k"]), Command::Fcall);
        assert_eq!(of(&["fcall_ro", "f", "1", "k"]), Command::Fcall);
        assert_eq!(of(&["EVALSHA", "abc", "1", "k"]), Command::Evalsha);
        assert_eq!(
            of(&["FUNCTION", "LOAD", "REPLACE", "x"]),
            Command::FunctionLoad
        );
        assert_eq!(of(&["SCRIPT", "LOAD", "x"]), Command::ScriptLoad);
        assert_eq!(of(&["TOUCH", "k"]), Command::Touch);
        assert_eq!(of(&["FUNCTION", "LIST"]), Command::Other);
        assert_eq!(of(&["SCRIPT", "FLUSH"]), Command::Other);
        assert_eq!(of(&["SET", "k", "1"]), Command::Other);
    }

    #[test]
    fn labels_are_distinct() {
        let commands: std::collections::HashSet<_> =
            Command::ALL.iter().map(|c| c.label()).collect();
        assert_eq!(commands.len(), Command::ALL.len());
        for (i, command) in Command::ALL.iter().enumerate() {
            assert_eq!(*command as usize, i);
        }
        for (i, result) in CallResult::ALL.iter().enumerate() {
            assert_eq!(*result as usize, i);
        }
    }
}
