use super::*;
use crate::proxy::body;

fn uri(s: &str) -> Uri {
    s.parse().unwrap()
}

#[test]
fn the_idle_list_keeps_the_most_recent_up_to_its_bound() {
    let mut list = VecDeque::new();
    for n in 0..3 {
        assert_eq!(push_bounded(&mut list, n, 3), None);
    }
    // The longest idle goes; the most recent is taken first.
    assert_eq!(push_bounded(&mut list, 3, 3), Some(0));
    assert_eq!(list, [1, 2, 3]);
    assert_eq!(list.pop_back(), Some(3));
}

#[test]
fn the_host_field_leaves_out_the_default_port_only() {
    assert_eq!(host_of(&uri("http://app:80")).unwrap(), "app");
    assert_eq!(host_of(&uri("http://app")).unwrap(), "app");
    assert_eq!(
        host_of(&uri("http://127.0.0.1:3000/base")).unwrap(),
        "127.0.0.1:3000"
    );
}

#[tokio::test]
async fn an_upstream_that_cannot_be_reached_is_a_connect_failure_and_leaves_nothing_idle() {
    let pool = Pool::start(HttpConnector::new(), http1::Builder::new());
    assert_eq!(pool.idle_count(), 0);
    // No upstream answers on an unbound port: no idle connection is
    // invented, and the failure is a connect failure.
    let closed = uri("http://127.0.0.1:1");
    let request = Request::new(body::empty());
    assert!(matches!(
        pool.send(&closed, request).await,
        Err(Failure::Connect(_))
    ));
    assert_eq!(pool.idle_count(), 0);
}

/// A listener on a free loopback port, and its URL.
async fn app() -> (tokio::net::TcpListener, Uri) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    (listener, base.parse().unwrap())
}

#[tokio::test]
async fn a_resend_goes_on_a_new_connection_and_leaves_the_other_idle_ones() {
    use tokio::io::AsyncReadExt;
    // An app that reads each request's head, keeps it, and closes without
    // a word.
    let (listener, base) = app().await;
    let heads = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&heads);
    let accepted = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let kept = Arc::clone(&kept);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                sync::lock(&kept).push(head);
            });
        }
    });
    let pool = Pool::start(HttpConnector::new(), http1::Builder::new());
    let authority = base.authority().unwrap().clone();
    for _ in 0..2 {
        let conn = pool.connect(&base).await.unwrap();
        pool.put(authority.clone(), conn);
    }
    let mut request = Request::new(body::empty());
    *request.uri_mut() = "/a?b=c".parse().unwrap();
    let headers = request.headers_mut();
    headers.insert(http::header::HOST, HeaderValue::from_static("app"));
    headers.append("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
    headers.append("accept", HeaderValue::from_static("*/*"));
    headers.append("x-forwarded-for", HeaderValue::from_static("10.0.0.2"));
    // The newest idle connection is closed on it, the copy is closed
    // on a new one: an error, and the older idle connection untouched.
    let sent = pool.send(&base, request).await;
    assert!(
        matches!(sent, Err(Failure::Exchange(_))),
        "{:?}",
        sent.err()
    );
    assert_eq!(pool.idle_count(), 1);
    // Both attempts carried the same head, byte for byte.
    let deadline = Instant::now() + Duration::from_secs(5);
    while sync::lock(&heads).len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let heads = sync::lock(&heads).clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert_eq!(heads[0], heads[1]);
    let head = String::from_utf8_lossy(&heads[0]);
    assert!(
        head.starts_with("GET /a?b=c HTTP/1.1\r\n") && head.contains("10.0.0.2"),
        "{head}"
    );
    accepted.abort();
}

#[tokio::test]
async fn idle_connections_are_closed_once_older_than_the_idle_limit() {
    let (listener, base) = app().await;
    let accepted = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let pool = Pool::start(HttpConnector::new(), http1::Builder::new());
    let authority = base.authority().unwrap().clone();
    for _ in 0..2 {
        let conn = pool.connect(&base).await.unwrap();
        pool.put(authority.clone(), conn);
    }
    assert_eq!(pool.idle_count(), 2);
    pool.prune(Instant::now() + POOL_IDLE / 2);
    assert_eq!(pool.idle_count(), 2);
    // Another authority's connections are never handed out (a reload
    // that moved the upstream): they are closed on the way.
    let other: Authority = "elsewhere:1".parse().unwrap();
    assert!(pool.idle_connection(&other).await.is_none());
    assert_eq!(pool.idle_count(), 0);
    for _ in 0..2 {
        let conn = pool.connect(&base).await.unwrap();
        pool.put(authority.clone(), conn);
    }
    pool.prune(Instant::now() + POOL_IDLE + Duration::from_secs(1));
    assert_eq!(pool.idle_count(), 0);
    accepted.abort();
}
