//! Putting the scripts into Redis: every one at start (and those a reload
//! brings), one on the node that answered it did not have it. As Functions
//! libraries (`FUNCTION LOAD REPLACE`, each behind its lease, see
//! `libraries`) or as cached scripts (`SCRIPT LOAD`, nothing to lease: the
//! cache is not kept across a restart, nor replicated), as `mode` says.

use redis::{ErrorKind, RedisError, Value};

use super::call::broken_connection;
use super::connect::Conn;
use super::mode::Mode;
use super::pool::Stage;
use super::scripts::Script;
use super::Inner;

impl Inner {
    /// Loads `script` in `mode` on the node that serves `key`.
    pub(super) async fn load(
        &self,
        script: &Script,
        mode: Mode,
        conn: &mut Conn,
        key: &[u8],
    ) -> Result<(), RedisError> {
        let reply = conn.load_script(script.load_command(mode), key).await?;
        self.stats.script_loads.count();
        loaded(script, mode, &reply)
    }

    /// Loads a script on every primary, answering only when all succeeded
    /// (a Functions library reaches the replicas by replication; a cached
    /// script does not, and a promoted replica loads it on NOSCRIPT).
    pub(super) async fn load_everywhere(
        &self,
        script: &Script,
        mode: Mode,
        conn: &mut Conn,
    ) -> Result<(), RedisError> {
        let reply = conn.load_everywhere(script.load_command(mode)).await?;
        self.stats.script_loads.count();
        loaded(script, mode, &reply)
    }

    /// Leases (Functions only) and loads one script on every node.
    async fn lease_and_load(
        &self,
        script: &Script,
        mode: Mode,
        conn: &mut Conn,
    ) -> Result<(), RedisError> {
        if mode == Mode::Functions {
            // The lease first: a sidecar starting meanwhile must not find
            // the library loaded and unleased, and delete it.
            self.lease(script, conn).await?;
        }
        self.load_everywhere(script, mode, conn).await
    }

    /// Loads one script on every node.
    pub(super) async fn load_one(&self, script: &Script) -> Result<(), RedisError> {
        let mut stage = Stage::Waiting;
        let checkout = self.lanes.acquire(&mut stage).await?;
        let mut conn = checkout.conn.clone();
        let loaded = self
            .lease_and_load(script, self.modes.current(), &mut conn)
            .await;
        if let Err(e) = &loaded {
            if broken_connection(e) {
                self.lanes.retire(&checkout);
            }
        }
        loaded
    }

    /// Loads every script made so far, settling `store.scripts: auto`
    /// first.
    pub(super) async fn load_all(&self) -> Result<(), RedisError> {
        let mut stage = Stage::Waiting;
        let checkout = self.lanes.acquire(&mut stage).await?;
        let mut conn = checkout.conn.clone();
        let loaded = self.load_all_on(&mut conn).await;
        if let Err(e) = &loaded {
            if broken_connection(e) {
                self.lanes.retire(&checkout);
            }
        }
        self.modes.loaded(loaded.as_ref().map(|_| ()));
        loaded
    }

    async fn load_all_on(&self, conn: &mut Conn) -> Result<(), RedisError> {
        // The probe's script too: readiness then proves the ACL lets
        // sluice load and run scripts, whatever the configuration holds.
        self.scripts.get(&self.probe.policy);
        let mode = self.settle_mode(conn).await?;
        for script in self.scripts.all() {
            self.lease_and_load(&script, mode, conn).await?;
        }
        Ok(())
    }
}

/// `FUNCTION LOAD` answers with the library's name, `SCRIPT LOAD` with the
/// script's SHA-1.
fn loaded(script: &Script, mode: Mode, reply: &Value) -> Result<(), RedisError> {
    let expected = script.loaded_as(mode).as_bytes();
    match reply {
        Value::BulkString(got) if got.eq_ignore_ascii_case(expected) => Ok(()),
        Value::SimpleString(got) if got.as_bytes().eq_ignore_ascii_case(expected) => Ok(()),
        _ => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            match mode {
                Mode::Functions => "FUNCTION LOAD named another library",
                Mode::Eval => "SCRIPT LOAD answered another SHA-1",
            },
        ))),
    }
}
