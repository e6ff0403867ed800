//! A relay between a Redis store and its `redis-server` that loses one
//! reply: the command ran, the store never hears of it. What a retry after
//! an ambiguous failure is for.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A relay between the store and Redis that, once armed, forwards the next
/// `FCALL` and then drops its reply and the connection: the script ran
/// but the store never hears of it.
pub struct Relay {
    pub port: u16,
    pub armed: Arc<AtomicBool>,
    pub dropped: Arc<AtomicUsize>,
}

pub async fn relay(target: u16) -> Relay {
    relay_on(target, b"FCALL").await
}

/// [`relay`], armed by the next command that holds `pattern`.
pub async fn relay_on(target: u16, pattern: &'static [u8]) -> Relay {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind relay");
    let port = listener.local_addr().expect("addr").port();
    let armed = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicUsize::new(0));
    let (a, d) = (armed.clone(), dropped.clone());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                continue;
            };
            tokio::spawn(pipe(client, server, pattern, a.clone(), d.clone()));
        }
    });
    Relay {
        port,
        armed,
        dropped,
    }
}

async fn pipe(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    pattern: &'static [u8],
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let doomed = AtomicBool::new(false);
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = client_rx.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let fcall = buf[..n].windows(pattern.len()).any(|w| w == pattern);
            if fcall && armed.swap(false, Ordering::SeqCst) {
                doomed.store(true, Ordering::SeqCst);
            }
            if server_tx.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = server_rx.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if doomed.load(Ordering::SeqCst) {
                dropped.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    // Either side ending drops both sockets.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}
