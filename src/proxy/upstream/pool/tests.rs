use super::*;

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

#[test]
fn only_idempotent_requests_without_a_body_are_sent_twice() {
    let request = |method: Method, body: Body| {
        let mut r = Request::new(body);
        *r.method_mut() = method;
        r
    };
    assert!(replayable(&request(Method::GET, body::empty())));
    assert!(replayable(&request(Method::DELETE, body::empty())));
    assert!(!replayable(&request(Method::POST, body::empty())));
    assert!(!replayable(&request(Method::PATCH, body::empty())));
    assert!(!replayable(&request(Method::PUT, body::full("x"))));
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
    // An app that reads each request's head and closes without a word.
    let (listener, base) = app().await;
    let accepted = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
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
    *request.uri_mut() = "/".parse().unwrap();
    request
        .headers_mut()
        .insert(http::header::HOST, HeaderValue::from_static("app"));
    // The newest idle connection is closed on it, the copy is closed
    // on a new one: an error, and the older idle connection untouched.
    let sent = pool.send(&base, request).await;
    assert!(
        matches!(sent, Err(Failure::Exchange(_))),
        "{:?}",
        sent.err()
    );
    assert_eq!(pool.idle_count(), 1);
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
