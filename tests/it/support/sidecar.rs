//! `Sidecar`: the built `sluice` binary serving a temporary configuration.
//!
//! Configurations listen on `127.0.0.1:0`; the bound addresses are read
//! back from the JSON log line whose message is `listening`. The process is
//! killed and reaped on drop, so a failing test leaves nothing running.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// How long a starting sidecar may take to report its addresses, and a
/// failing one to exit.
pub const START_DEADLINE: Duration = Duration::from_secs(10);

pub struct Sidecar {
    child: Child,
    traffic: SocketAddr,
    admin: Option<SocketAddr>,
    config_path: PathBuf,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    // Held so the configuration file outlives the process.
    _dir: TempDir,
}

impl Sidecar {
    /// Writes `yaml` to a temporary file and runs `sluice run --config` on
    /// it; panics (with the process's output) if it does not report its
    /// addresses within [`START_DEADLINE`].
    pub fn start(yaml: &str) -> Sidecar {
        Sidecar::start_with_env(yaml, &[])
    }

    /// As [`Sidecar::start`], with extra environment variables.
    pub fn start_with_env(yaml: &str, env: &[(&str, &str)]) -> Sidecar {
        Sidecar::start_via(yaml, env, &[])
    }

    /// As [`Sidecar::start`], the binary run by `launcher` (a program and
    /// its first arguments, which must end by exec'ing the rest of its
    /// arguments: the binary and `run --config FILE`), e.g. to place it in
    /// a cgroup before it starts.
    pub fn start_via(yaml: &str, env: &[(&str, &str)], launcher: &[&str]) -> Sidecar {
        let (dir, config_path) = write_config(yaml);
        let mut child = launched(command(&config_path, env), launcher)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the sluice binary");

        let stdout_lines = Arc::new(Mutex::new(Vec::new()));
        let stderr_text = Arc::new(Mutex::new(String::new()));
        let (line_tx, line_rx) = mpsc::channel::<String>();
        let out = child.stdout.take().expect("piped stdout");
        let lines = stdout_lines.clone();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                lock(&lines).push(line.clone());
                // The receiver is gone once the addresses are known.
                let _ = line_tx.send(line);
            }
        });
        let err = child.stderr.take().expect("piped stderr");
        let text = stderr_text.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(err);
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                lock(&text).push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });

        let mut sidecar = Sidecar {
            child,
            traffic: SocketAddr::from(([0, 0, 0, 0], 0)),
            admin: None,
            config_path,
            stdout: stdout_lines,
            stderr: stderr_text,
            _dir: dir,
        };
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match line_rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some((traffic, admin)) = listening(&line) {
                        sidecar.traffic = traffic;
                        sidecar.admin = admin;
                        return sidecar;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    sidecar.fail("did not log a `listening` line in time")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    sidecar.fail("closed stdout before logging `listening`")
                }
            }
        }
    }

    /// `127.0.0.1:PORT` of the traffic listener.
    pub fn addr(&self) -> SocketAddr {
        self.traffic
    }

    /// The admin listener, when `server.admin` is configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// The configuration file (rewrite it to exercise reload).
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every stdout line so far.
    pub fn logs(&self) -> Vec<String> {
        lock(&self.stdout).clone()
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        lock(&self.stderr).clone()
    }

    /// Sends `signal` (e.g. `"TERM"`, `"HUP"`) through `kill(1)`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill -{signal} failed: {status}");
    }

    /// Waits for the process to exit by itself; `None` if it is still
    /// running after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn fail(&mut self, what: &str) -> ! {
        let _ = self.child.kill();
        let status = self.child.wait();
        // Give the reader threads a moment to drain the pipes.
        thread::sleep(Duration::from_millis(50));
        panic!(
            "sluice {what} (exit: {status:?})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.logs().join("\n"),
            self.stderr()
        );
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `sluice` with `args` to completion (e.g. `check --config FILE`,
/// `--version`): exit code, stdout, stderr. Panics if it runs longer than
/// [`START_DEADLINE`] or is ended by a signal.
pub fn run_binary(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(args).env_remove("SLUICE_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_to_exit(cmd)
}

/// Writes `yaml` as `sluice.yaml` in a fresh temporary directory.
pub fn write_config(yaml: &str) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join("sluice.yaml");
    std::fs::write(&path, yaml).expect("write the configuration");
    (dir, path)
}

fn command(config: &Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("run")
        .arg("--config")
        .arg(config)
        .env_remove("SLUICE_CONFIG")
        // The `listening` line is at info; a developer's RUST_LOG=warn must
        // not hide it. `env` may still raise the level.
        .env("SLUICE_LOG", "info")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// `cmd` run through `launcher`, with `cmd`'s program and arguments
/// appended to the launcher's; the environment is kept.
fn launched(cmd: Command, launcher: &[&str]) -> Command {
    let Some((program, first)) = launcher.split_first() else {
        return cmd;
    };
    let mut out = Command::new(program);
    out.args(first).arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => out.env(k, v),
            None => out.env_remove(k),
        };
    }
    out.stdin(Stdio::null());
    out
}

fn run_to_exit(mut cmd: Command) -> (i32, String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the sluice binary");
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + START_DEADLINE;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stdout = out_reader.join().unwrap_or_default();
            let stderr = err_reader.join().unwrap_or_default();
            panic!(
                "sluice still running after {START_DEADLINE:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    match status.code() {
        Some(code) => (code, stdout, stderr),
        None => panic!("sluice ended by a signal ({status})\n--- stderr ---\n{stderr}"),
    }
}

/// The addresses in a `listening` log line, whether the event's fields are
/// flattened at the top level or nested under `fields`.
fn listening(line: &str) -> Option<(SocketAddr, Option<SocketAddr>)> {
    let json: Value = serde_json::from_str(line).ok()?;
    let fields = match json.get("fields") {
        Some(nested) if nested.get("message").is_some() => nested,
        _ => &json,
    };
    if fields.get("message")?.as_str()? != "listening" {
        return None;
    }
    let addr = |key: &str| fields.get(key)?.as_str()?.parse::<SocketAddr>().ok();
    Some((addr("traffic_addr")?, addr("admin_addr")))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The readers only append; a poisoned lock still holds usable output.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::listening;

    #[test]
    fn reads_flattened_and_nested_listening_lines() {
        let flat = r#"{"level":"INFO","message":"listening","traffic_addr":"127.0.0.1:4000","admin_addr":"127.0.0.1:4001"}"#;
        let (t, a) = listening(flat).expect("flattened line");
        assert_eq!(t.port(), 4000);
        assert_eq!(a.map(|a| a.port()), Some(4001));

        let nested = r#"{"fields":{"message":"listening","traffic_addr":"127.0.0.1:4000"}}"#;
        let (t, a) = listening(nested).expect("nested line");
        assert_eq!(t.port(), 4000);
        assert_eq!(a, None);

        assert!(listening(r#"{"message":"started"}"#).is_none());
        assert!(listening("not json").is_none());
    }
}
