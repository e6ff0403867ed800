//! `sluice check` and `sluice run` on configuration files, through the
//! built binary: a bad file exits 2 with `FILE:LINE:COL: KEY: message` on
//! stderr and never opens a port; a good one prints the route table.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use sluice::config::Config;

/// A refused configuration exits with this code.
const INVALID_CONFIG: i32 = 2;

/// How long the binary may take to validate a file and exit.
const DEADLINE: Duration = Duration::from_secs(10);

/// Each error fixture with where its (first) error is, and its key path.
const ERROR_FIXTURES: [(&str, &str, &str); 22] = [
    ("unknown_key.yaml", "4:3", "server.shutdown_grase"),
    ("missing_policy.yaml", "17:13", "routes[1].policy"),
    ("unset_variable.yaml", "9:8", "store.url"),
    ("bad_duration.yaml", "7:12", "upstream.timeout"),
    ("empty_bands.yaml", "9:12", "policies.export.bands"),
    ("zero_limit.yaml", "11:18", "policies.export.bands[1].limit"),
    ("cost_above_maximum.yaml", "15:11", "routes[0].cost"),
    ("foreign_parameter.yaml", "11:5", "policies.api.capacity"),
    ("store_kind_mismatch.yaml", "8:3", "store.pool_size"),
    (
        "redis_without_pseudonym_key.yaml",
        "10:3",
        "identity.pseudonym_key",
    ),
    ("duplicate_route.yaml", "10:11", "routes[1].name"),
    ("several_errors.yaml", "4:3", "server.listen_backlog"),
    ("yaml_syntax.yaml", "4:9", ""),
    ("h2c_upgrade.yaml", "10:27", "routes[0].upgrades[1]"),
    (
        "unsafe_route_path.yaml",
        "8:27",
        "routes[0].match.path_prefix",
    ),
    (
        "bad_path_setting.yaml",
        "6:22",
        "server.paths.escaped_slashes",
    ),
    ("limits_beside_policy.yaml", "12:5", "routes[0].policy"),
    (
        "global_in_a_list.yaml",
        "12:54",
        "routes[0].limits[0].subject[1]",
    ),
    (
        "concurrency_with_window.yaml",
        "10:5",
        "policies.in_flight.window",
    ),
    ("local_on_memory.yaml", "8:15", "store.on_failure"),
    ("local_share_unused.yaml", "10:3", "store.local_share"),
    (
        "bad_min_upload_rate.yaml",
        "7:12",
        "server.min_upload_rate.grace",
    ),
];

/// Variables the fixtures name, removed so the host cannot set them.
const FIXTURE_VARIABLES: [&str; 5] = [
    "SLUICE_FIXTURE_REDIS_URL",
    "SLUICE_FIXTURE_UPSTREAM_URL",
    "SLUICE_FIXTURE_IN_COMMENT",
    "REDIS_URL",
    "SLUICE_PSEUDONYM_KEY",
];

fn repo_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn fixture(name: &str) -> PathBuf {
    repo_file("tests/fixtures/config").join(name)
}

fn sluice() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.env_remove("SLUICE_CONFIG");
    for var in FIXTURE_VARIABLES {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `cmd` to its exit; kills it and panics past [`DEADLINE`].
fn run(mut cmd: Command) -> Output {
    let mut child = cmd.spawn().expect("spawn the sluice binary");
    let deadline = Instant::now() + DEADLINE;
    while child.try_wait().expect("poll the child").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("reap the child");
            panic!(
                "sluice still running after {DEADLINE:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("collect output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn check(path: &Path) -> Output {
    let mut cmd = sluice();
    cmd.arg("check").arg("--config").arg(path);
    run(cmd)
}

#[test]
fn check_refuses_every_error_fixture_naming_file_line_and_key() {
    for (name, position, key) in ERROR_FIXTURES {
        let path = fixture(name);
        let out = check(&path);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(INVALID_CONFIG),
            "{name}: stderr:\n{stderr}"
        );
        let expected = if key.is_empty() {
            format!("{}:{position}: ", path.display())
        } else {
            format!("{}:{position}: {key}: ", path.display())
        };
        assert!(
            stderr.lines().any(|line| line.starts_with(&expected)),
            "{name}: no line starting with {expected:?} in:\n{stderr}"
        );
        assert!(
            !text(&out.stdout).contains("ROUTE"),
            "{name}: a refused file printed a route table"
        );
    }
}

#[test]
fn check_reports_every_error_of_a_file_one_per_line() {
    let out = check(&fixture("several_errors.yaml"));
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    let stderr = text(&out.stderr);
    for key in [
        "server.listen_backlog",
        "upstream.url",
        "store.budget",
        "policies.export.bands",
        "routes[0].cost",
        "routes[1].policy",
    ] {
        let found = stderr
            .lines()
            .filter(|line| line.contains(&format!(": {key}: ")))
            .count();
        assert_eq!(found, 1, "{key} in:\n{stderr}");
    }
}

#[test]
fn check_prints_every_route_of_the_shipped_configs() {
    for name in ["config/example.yaml", "config/quickstart.yaml"] {
        let path = repo_file(name);
        let config = Config::parse_with_env(
            &path,
            &std::fs::read_to_string(&path).expect("readable"),
            &|_| Err(std::env::VarError::NotPresent),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let out = check(&path);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}: stderr:\n{}",
            text(&out.stderr)
        );
        for route in config.live.routes.iter().chain([&config.live.default]) {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("{} ", route.name))),
                "{name}: route {} missing from:\n{stdout}",
                route.name
            );
        }
    }
}

#[test]
fn check_prints_every_limit_of_a_route() {
    let out = check(&repo_file("config/example.yaml"));
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("signup "))
        .unwrap_or_else(|| panic!("no signup route in:\n{stdout}"));
    let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    let first = words(lines[at]);
    assert!(first.contains(&"login".to_owned()), "{stdout}");
    // Each further limit on a line of its own, the route's columns blank.
    let second = words(lines[at + 1]);
    assert_eq!(&second[..2], ["global", "app_cap"], "{stdout}");
    let third = words(lines[at + 2]);
    assert_eq!(
        &third[..3],
        ["global", "in_flight", "concurrency"],
        "{stdout}"
    );
    assert!(lines[at + 1].starts_with(' ') && lines[at + 2].starts_with(' '));
}

/// ON_FAILURE is each limit's own `on_failure`, else the store's; under
/// `local`, the quota one sidecar enforces alone (÷ `local_share`). LIMITS
/// says which are leased by default (not a login's 5: a tenth of it is no
/// unit).
#[test]
fn check_prints_what_each_limit_does_when_the_store_cannot_decide() {
    let out = check(&fixture("local_fallback.yaml"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let expected = "\
ROUTE    METHODS  PATH            SUBJECT    POLICY     LIMITS                                        COST  SHADOW  ON_FAILURE            REVISION      UPGRADES
signup   POST     exact /signup   client_ip  login      token-bucket 5 (+1/10s)                       1     no      local ÷3: 1 (+1/30s)  d8ca2af6679e  websocket
                                  global     app_cap    fixed-window 100/1m leased 250ms ≤10% (auto)  1     no      deny                  6836fc5939e4
                                  global     in_flight  concurrency 40 in flight                      1     no      -                     -
export   *        prefix /export  client_ip  export     sliding-log 20/10s                            1     no      allow                 0780eb0dabb8  websocket
health   *        exact /health   -          none       unlimited                                     -     -       -                     -             websocket
default  *        any             client_ip  login      token-bucket 5 (+1/10s)                       1     no      local ÷3: 1 (+1/30s)  d8ca2af6679e  websocket

Counts survive a reload that changes a policy's other numbers; these start them afresh:
  login    token-bucket     the algorithm, the number or order of bands
  app_cap  fixed-window     `window`, the algorithm, the number or order of bands
  export   sliding-log      `window`, the algorithm, the number or order of bands
";
    assert_eq!(text(&out.stdout), expected);
}

#[test]
fn variables_come_from_the_environment() {
    let path = fixture("product.yaml");
    let out = check(&path);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG), "{stderr}");
    assert!(stderr.contains(": store.url: environment variable `REDIS_URL` is not set"));
    assert!(stderr.contains(
        ": identity.pseudonym_key: environment variable `SLUICE_PSEUDONYM_KEY` is not set"
    ));

    let mut cmd = sluice();
    cmd.arg("check")
        .arg("--config")
        .arg(&path)
        .env("REDIS_URL", "redis://127.0.0.1:6379")
        .env("SLUICE_PSEUDONYM_KEY", "0123456789abcdef0123456789abcdef");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("login"));
}

#[test]
fn the_config_path_may_come_from_sluice_config() {
    let mut cmd = sluice();
    cmd.arg("check")
        .env("SLUICE_CONFIG", repo_file("config/quickstart.yaml"));
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("everything"));

    let bad = fixture("missing_policy.yaml");
    let mut cmd = sluice();
    cmd.arg("check").env("SLUICE_CONFIG", &bad);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(text(&out.stderr).contains(&format!("{}:17:13: routes[1].policy: ", bad.display())));
}

/// A port nothing listens on right now.
fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address")
}

#[test]
fn run_refuses_an_invalid_config_before_opening_any_port() {
    let traffic = free_port();
    let admin = free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("sluice.yaml");
    let mut file = std::fs::File::create(&path).expect("create config");
    write!(
        file,
        "version: 1
server:
  listen: {traffic}
  admin: {admin}
upstream:
  url: http://127.0.0.1:9
routes:
  - name: everything
    policy: missing
"
    )
    .expect("write config");
    drop(file);

    let mut cmd = sluice();
    cmd.arg("run").arg("--config").arg(&path);
    let mut child = cmd.spawn().expect("spawn the sluice binary");
    let deadline = Instant::now() + DEADLINE;
    let mut accepted = Vec::new();
    // Probe both ports for as long as the process lives.
    while child.try_wait().expect("poll the child").is_none() {
        for addr in [traffic, admin] {
            let connected = TcpStream::connect_timeout(&addr, Duration::from_millis(50)).is_ok();
            if connected && !accepted.contains(&addr) {
                accepted.push(addr);
            }
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice run on an invalid config still running after {DEADLINE:?}");
        }
        thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().expect("collect output");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:9:13: routes[0].policy: ", path.display())),
        "{stderr}"
    );
    assert!(accepted.is_empty(), "connections accepted on {accepted:?}");
}

#[test]
fn the_shipped_redis_configuration_checks_with_its_secrets_set() {
    let path = repo_file("config/redis.yaml");
    let mut cmd = sluice();
    cmd.arg("check")
        .arg("--config")
        .arg(&path)
        .env("REDIS_URL", "redis://sluice:pw@redis.limiter:6379/0")
        .env("SLUICE_PSEUDONYM_KEY", "0123456789abcdef0123456789abcdef");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for route in ["login ", "api ", "health ", "default "] {
        assert!(
            stdout.lines().any(|l| l.starts_with(route)),
            "{route}missing from:\n{stdout}"
        );
    }
    // Without the secrets it names what is missing.
    let mut cmd = sluice();
    cmd.arg("check")
        .arg("--config")
        .arg(&path)
        .env_remove("REDIS_URL")
        .env_remove("SLUICE_PSEUDONYM_KEY");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("REDIS_URL"),
        "{}",
        text(&out.stderr)
    );
}

// --- `sluice check --allow-unset` and `--connect` --------------------------

use crate::support::redis::RedisServer;

fn check_with(path: &Path, flags: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = sluice();
    cmd.arg("check").arg("--config").arg(path).args(flags);
    for (name, value) in env {
        cmd.env(name, value);
    }
    cmd.env_remove("REDIS_URL")
        .env_remove("SLUICE_PSEUDONYM_KEY");
    for (name, value) in env {
        cmd.env(name, value);
    }
    run(cmd)
}

#[test]
fn allow_unset_checks_a_configuration_without_its_secrets_and_names_them() {
    let out = check_with(&fixture("product.yaml"), &["--allow-unset"], &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(stdout.contains("login"), "{stdout}");
    assert!(
        stdout.contains(
            "Unset, checked with a placeholder in their place: REDIS_URL, SLUICE_PSEUDONYM_KEY"
        ),
        "{stdout}"
    );
    // A variable that is set is used, and not listed.
    let out = check_with(
        &fixture("product.yaml"),
        &["--allow-unset"],
        &[("REDIS_URL", "redis://127.0.0.1:6379")],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("in their place: SLUICE_PSEUDONYM_KEY\n"),
        "{stdout}"
    );

    // Only the variables are forgiven: any other mistake still fails.
    let out = check_with(&fixture("bad_duration.yaml"), &["--allow-unset"], &[]);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(text(&out.stderr).contains("upstream.timeout"));
    // A variable inside a value (a password in a URL) gets a placeholder
    // that keeps the URL whole.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("inside.yaml");
    std::fs::write(
        &path,
        "version: 1
server: { listen: 127.0.0.1:8080 }
upstream: { url: http://127.0.0.1:3000 }
store: { kind: redis, url: \"redis://app:${CHECK_REDIS_PASSWORD}@redis:6379/0\" }
identity: { pseudonym_key: \"${CHECK_PSEUDONYM_KEY}\" }
",
    )
    .expect("write the file");
    let out = check_with(&path, &["--allow-unset"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("CHECK_REDIS_PASSWORD, CHECK_PSEUDONYM_KEY"));
}

/// A Redis configuration for `--connect`, with a policy of each state shape.
fn connect_config(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("connect.yaml");
    std::fs::write(
        &path,
        format!(
            "version: 1
server: {{ listen: 127.0.0.1:8080 }}
upstream: {{ url: http://127.0.0.1:3000 }}
store: {{ kind: redis, url: \"{url}\" }}
identity: {{ pseudonym_key: \"0123456789abcdef0123456789abcdef\" }}
policies:
  fw: {{ algorithm: fixed-window, limit: 5, window: 1m }}
  sl: {{ algorithm: sliding-log, limit: 5, window: 1m }}
routes:
  - {{ name: a, match: {{ path_prefix: /a }}, subject: client_ip, policy: fw }}
  - {{ name: b, match: {{ path_prefix: /b }}, subject: client_ip, policy: sl }}
"
        ),
    )
    .expect("write the file");
    path
}

/// The store report's lines: `(ok, what)` in order.
fn steps(stdout: &str) -> Vec<(bool, String)> {
    stdout
        .lines()
        .skip_while(|l| *l != "Store (redis):")
        .skip(1)
        .map(|l| {
            let l = l.trim_start();
            let ok = l.starts_with("ok ");
            let rest = l
                .trim_start_matches("ok")
                .trim_start_matches("FAIL")
                .trim_start();
            (ok, rest.split(':').next().unwrap_or("").to_owned())
        })
        .collect()
}

#[test]
fn connect_tries_the_store_step_by_step_and_exits_1_at_the_first_failure() {
    let sluice_acl = "user sluice on >pw resetchannels ~sluice:* -@all \
         +fcall +function|load +function|list +function|delete +ping +time +get +set +pexpire +touch \
         +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore";
    let no_load =
        "user noload on >pw resetchannels ~sluice:* -@all +fcall +ping +time +get +set +pexpire";
    let no_zadd = "user nozadd on >pw resetchannels ~sluice:* -@all \
         +fcall +function|load +ping +time +get +set +pexpire +zcount +zrange +zrangebyscore";
    let redis = RedisServer::builder()
        .config("user default off")
        .config("user admin on >admin-pw ~* &* +@all")
        .config(sluice_acl)
        .config(no_load)
        .config(no_zadd)
        .admin("admin", "admin-pw")
        .start();
    let dir = tempfile::tempdir().expect("temp dir");
    let all = [
        "standalone",
        "PING",
        "server",
        "scripts",
        "policy fw",
        "policy sl",
    ];

    // The least-privilege user: every step passes (INFO it may not run).
    let out = check_with(
        &connect_config(dir.path(), &redis.url_as("sluice", "pw")),
        &["--connect"],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert_eq!(
        steps(&stdout),
        all.iter()
            .map(|s| (true, s.to_string()))
            .collect::<Vec<_>>(),
        "{stdout}"
    );
    assert!(stdout.contains("INFO not permitted"), "{stdout}");
    // As an admin, the server is named.
    let out = check_with(
        &connect_config(dir.path(), &redis.url_as("admin", "admin-pw")),
        &["--connect"],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("server: Redis 7."), "{stdout}");

    let failing = |url: String, failed: &str| {
        let out = check_with(&connect_config(dir.path(), &url), &["--connect"], &[]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
        let found = steps(&stdout);
        let (last, before) = found.split_last().expect("at least one step");
        assert_eq!(last, &(false, failed.to_owned()), "{stdout}");
        assert!(before.iter().all(|(ok, _)| *ok), "{stdout}");
        stdout
    };
    // A user that may not load functions; one that may not run what the
    // sliding log's function runs; a wrong password; nothing listening.
    let stdout = failing(redis.url_as("noload", "pw"), "scripts");
    assert!(stdout.contains("+function|load"), "{stdout}");
    failing(redis.url_as("nozadd", "pw"), "policy sl");
    failing(redis.url_as("sluice", "wrong"), "standalone");
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    failing(format!("redis://127.0.0.1:{closed}"), "standalone");

    // With placeholders there is nothing real to connect to.
    let out = check_with(
        &fixture("product.yaml"),
        &["--allow-unset", "--connect"],
        &[],
    );
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(text(&out.stderr).contains("--connect needs the real settings"));
}

/// Runs `cmd` with its standard output a pipe whose reader is gone before
/// the binary writes anything (`sluice check | head` once `head` has what
/// it wants): every write fails with `EPIPE`.
fn run_with_stdout_closed(mut cmd: Command) -> Output {
    let mut child = cmd.spawn().expect("spawn the sluice binary");
    drop(child.stdout.take());
    let deadline = Instant::now() + DEADLINE;
    while child.try_wait().expect("poll the child").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("sluice still running after {DEADLINE:?} with its stdout closed");
        }
        thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("reap the child")
}

#[test]
fn printing_commands_end_quietly_when_their_reader_goes_away() {
    let quickstart = repo_file("config/quickstart.yaml");
    let example = repo_file("config/example.yaml");
    let commands: [&[&std::ffi::OsStr]; 4] = [
        &[
            "check".as_ref(),
            "--config".as_ref(),
            quickstart.as_os_str(),
        ],
        &["check".as_ref(), "--config".as_ref(), example.as_os_str()],
        &["keys".as_ref()],
        &["keys".as_ref(), "--markdown".as_ref()],
    ];
    for args in commands {
        let mut cmd = sluice();
        cmd.args(args);
        let out = run_with_stdout_closed(cmd);
        let stderr = text(&out.stderr);
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{args:?}: stderr:\n{stderr}"
        );
        // The command's own verdict: the file is valid, the table printed
        // as far as anyone read it.
        assert_eq!(out.status.code(), Some(0), "{args:?}: stderr:\n{stderr}");
    }
}
