//! The quickstart (`scripts/quickstart.sh`) runs `config/quickstart.yaml`
//! and promises a newcomer 5 × 200 then 429s, whenever they run it. Here
//! the shipped file itself, with only its addresses replaced, runs in the
//! built binary, and its requests are made to straddle a wall-clock edge
//! of 10 s, where a window aligned to the clock would have turned over
//! and handed out a fresh quota.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::StatusCode;

use crate::support::{get, header, Sidecar, Upstream};

/// The edges a clock-aligned window of 10 s (the quickstart's old
/// policy), or of any divisor of it, turns over at.
const EDGE: Duration = Duration::from_secs(10);

/// The shipped quickstart, listening on free ports in front of `upstream`.
fn quickstart_yaml(upstream: &Upstream) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/quickstart.yaml");
    let yaml = std::fs::read_to_string(path).expect("config/quickstart.yaml is readable");
    let replaced = yaml
        .replace("listen: 127.0.0.1:8080", "listen: 127.0.0.1:0")
        .replace("admin: 127.0.0.1:9901", "admin: 127.0.0.1:0")
        .replace(
            "url: http://127.0.0.1:3000",
            &format!("url: {}", upstream.url()),
        );
    let settings: Vec<&str> = replaced
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .collect();
    for address in ["127.0.0.1:8080", "127.0.0.1:9901", "127.0.0.1:3000"] {
        assert!(
            !settings.iter().any(|line| line.contains(address)),
            "config/quickstart.yaml names {address} in a form this test does not replace"
        );
    }
    replaced
}

fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
}

/// Waits until the wall clock is past the next multiple of `EDGE` after
/// `from`, with a margin so that sluice's clock has passed it too.
async fn past_the_edge_after(from: Duration) {
    let edge_us = EDGE.as_micros();
    let next = (from.as_micros() / edge_us + 1) * edge_us;
    let target = Duration::from_micros(u64::try_from(next).expect("µs fit in u64"))
        + Duration::from_millis(300);
    let now = since_epoch();
    if target > now {
        tokio::time::sleep(target - now).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_shows_five_200s_then_429s_even_across_a_window_edge() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&quickstart_yaml(&upstream));

    // Eight requests as the script sends them, three on one side of an
    // edge and five on the other.
    let mut statuses = Vec::new();
    let first = since_epoch();
    for _ in 0..3 {
        statuses.push(get(sluice.addr(), "/", &[]).await.0);
    }
    past_the_edge_after(first).await;
    let mut refused = None;
    for _ in 0..5 {
        let (status, headers, _) = get(sluice.addr(), "/", &[]).await;
        statuses.push(status);
        if status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(headers);
        }
    }

    let ok = StatusCode::OK;
    let limited = StatusCode::TOO_MANY_REQUESTS;
    assert_eq!(
        statuses,
        [ok, ok, ok, ok, ok, limited, limited, limited],
        "the quickstart's 8 requests"
    );
    assert_eq!(
        upstream.count(),
        5,
        "only the admitted requests reach the app"
    );
    let refused = refused.expect("a 429 was answered");
    let retry_after: u64 = header(&refused, "retry-after")
        .expect("a 429 carries Retry-After")
        .parse()
        .expect("Retry-After in seconds");
    assert!(
        (1..=12).contains(&retry_after),
        "a token comes back within the bucket's 12 s: {retry_after}"
    );
}
