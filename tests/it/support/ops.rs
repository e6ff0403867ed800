//! For the operations tests: scraping and reading `/metrics`, `promtool`,
//! probes that expect a port to close, and a Kubernetes ConfigMap-style
//! mount whose `..data` symlink is swapped on every update.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;

use super::client::{build, http1_client, Reply, REQUEST_DEADLINE};
use super::get;

/// `GET /metrics` on the admin listener; panics unless it answers 200 text.
pub async fn scrape(admin: SocketAddr) -> String {
    let (status, _, body) = get(admin, "/metrics", &[]).await;
    assert_eq!(status, StatusCode::OK, "GET /metrics");
    String::from_utf8(body.to_vec()).expect("the exposition is UTF-8")
}

/// One sample line of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Every sample in `text`; comment and blank lines are skipped. Panics on
/// a line it cannot read, since that is malformed output.
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| parse_sample(line).unwrap_or_else(|| panic!("unreadable sample: {line:?}")))
        .collect()
}

/// The value of the series `name` whose labels are exactly `labels` (in
/// any order); `None` when there is no such series.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut wanted: Vec<(&str, &str)> = labels.to_vec();
    wanted.sort_unstable();
    samples(text)
        .into_iter()
        .find(|s| {
            let mut have: Vec<(&str, &str)> = s
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            have.sort_unstable();
            s.name == name && have == wanted
        })
        .map(|s| s.value)
}

/// `sluice_requests_total{route, policy, outcome}` in `text`; 0 when the
/// series is absent (a counter not yet counted).
pub fn requests_counted(text: &str, route: &str, policy: &str, outcome: &str) -> f64 {
    metric(
        text,
        "sluice_requests_total",
        &[("route", route), ("policy", policy), ("outcome", outcome)],
    )
    .unwrap_or(0.0)
}

/// Every label value in `text`, unescaped.
pub fn label_values(text: &str) -> Vec<String> {
    samples(text)
        .into_iter()
        .flat_map(|s| s.labels.into_iter().map(|(_, v)| v))
        .collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let mut labels = Vec::new();
    let rest = if let Some(mut body) = rest.strip_prefix('{') {
        loop {
            body = body.trim_start_matches([',', ' ']);
            if let Some(after) = body.strip_prefix('}') {
                break after;
            }
            let (key, after_key) = body.split_once("=\"")?;
            let (value, after_value) = unescape_until_quote(after_key)?;
            labels.push((key.trim().to_owned(), value));
            body = after_value;
        }
    } else {
        rest
    };
    // A timestamp may follow the value.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Reads a label value up to its closing quote (`\\`, `\"` and `\n` are
/// the format's escapes); the value and what follows the quote.
fn unescape_until_quote(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// Runs `promtool check metrics` on `text` and panics unless it exits 0
/// without a word. A missing promtool is a failure, not a skip: the check
/// is part of what these tests promise (Debian package `prometheus`).
pub fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}); install the Debian package `prometheus`")
        });
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("write the exposition to promtool");
    let output = child.wait_with_output().expect("wait for promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && said.trim().is_empty(),
        "promtool check metrics: {}\n{said}\n--- exposition ---\n{text}",
        output.status
    );
}

/// `GET path` that reports a refused connection or a broken exchange as
/// `Err` instead of panicking, for listeners that may be going away.
pub async fn try_get(addr: SocketAddr, path: &str) -> Result<Reply, String> {
    let req = build(addr, Method::GET, path, &[], Bytes::new());
    let exchange = async {
        let response = http1_client()
            .request(req)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| format!("{e:?}"))?;
        Ok((parts.status, parts.headers, body.to_bytes()))
    };
    tokio::time::timeout(REQUEST_DEADLINE, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no response within {REQUEST_DEADLINE:?}")))
}

/// Whether a new TCP connection to `addr` is refused (nothing listens).
pub async fn refuses_connections(addr: SocketAddr) -> bool {
    matches!(
        tokio::net::TcpStream::connect(addr).await,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// A directory laid out as the kubelet mounts a ConfigMap:
///
/// ```text
/// dir/..2026_01_01_00_00_00.000000001/sluice.yaml   the data
/// dir/..data -> ..2026_01_01_00_00_00.000000001
/// dir/sluice.yaml -> ..data/sluice.yaml
/// ```
///
/// An update writes a new timestamped directory, points `..data` at it by
/// renaming a fresh symlink over the old one (atomic), then deletes the old
/// directory: the file sluice was given is never written.
pub struct ConfigMapMount {
    dir: PathBuf,
    file: String,
    generation: u32,
}

impl ConfigMapMount {
    /// Turns the regular file at `path` into that layout, same content.
    /// The file is replaced by a symlink with a rename, so a reader never
    /// finds it missing or different.
    pub fn adopt(path: &Path) -> ConfigMapMount {
        let dir = path.parent().expect("a file in a directory").to_path_buf();
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .expect("a UTF-8 file name")
            .to_owned();
        let content = std::fs::read(path).expect("read the configuration");
        let mount = ConfigMapMount {
            dir,
            file,
            generation: 1,
        };
        mount.write_generation(&content);
        let data = mount.dir.join("..data");
        std::os::unix::fs::symlink(mount.generation_name(), &data).expect("symlink ..data");
        let tmp = mount.dir.join(format!("..{}.tmp", mount.file));
        std::os::unix::fs::symlink(format!("..data/{}", mount.file), &tmp)
            .expect("symlink the file");
        std::fs::rename(&tmp, path).expect("replace the file with its symlink");
        mount
    }

    /// Publishes `yaml` as the kubelet does: new directory, `..data` swap.
    pub fn update(&mut self, yaml: &str) {
        let old = self.dir.join(self.generation_name());
        self.generation += 1;
        self.write_generation(yaml.as_bytes());
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(self.generation_name(), &tmp).expect("symlink ..data_tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        std::fs::remove_dir_all(old).expect("remove the previous generation");
    }

    fn generation_name(&self) -> String {
        format!("..2026_01_01_00_00_00.{:09}", self.generation)
    }

    fn write_generation(&self, content: &[u8]) {
        let gen = self.dir.join(self.generation_name());
        std::fs::create_dir(&gen).expect("create the generation directory");
        std::fs::write(gen.join(&self.file), content).expect("write the generation's file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_with_labels_escapes_and_infinities() {
        let text = "# HELP x_total X.\n# TYPE x_total counter\n\
                    x_total{route=\"a\\\"b\",outcome=\"allowed\"} 3\n\
                    up 1\n\
                    h_bucket{le=\"+Inf\"} 5 1700000000\n";
        assert_eq!(
            metric(
                text,
                "x_total",
                &[("outcome", "allowed"), ("route", "a\"b")]
            ),
            Some(3.0)
        );
        assert_eq!(metric(text, "x_total", &[("outcome", "allowed")]), None);
        assert_eq!(metric(text, "up", &[]), Some(1.0));
        assert_eq!(metric(text, "h_bucket", &[("le", "+Inf")]), Some(5.0));
        assert_eq!(label_values(text), vec!["a\"b", "allowed", "+Inf"]);
    }

    #[test]
    fn adopting_and_updating_a_mount_keeps_the_path_and_swaps_the_content() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("sluice.yaml");
        std::fs::write(&path, "one").expect("write");
        let mut mount = ConfigMapMount::adopt(&path);
        assert!(std::fs::symlink_metadata(&path)
            .expect("metadata")
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "one");
        mount.update("two");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "two");
        let generations = std::fs::read_dir(dir.path())
            .expect("list")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("..2026"))
            })
            .count();
        assert_eq!(generations, 1, "the old generation is removed");
    }
}
