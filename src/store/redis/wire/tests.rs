//! The connection against a scripted peer on loopback: how replies are
//! matched to requests, and how a connection ends. (Against a real Redis,
//! the store's tests: tests/it/redis_store.rs and redis_topologies.rs.)

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// A connection to a peer on loopback, and the peer's end of it.
async fn pair() -> (Wire, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let wire = Wire::start(Stream::Plain(client.expect("connect")));
    (wire, accepted.expect("accept").0)
}

/// Reads whole commands (RESP arrays, framed like replies) until `n` have
/// arrived; returns each one's last argument.
async fn read_commands(peer: &mut TcpStream, n: usize) -> Vec<Vec<u8>> {
    let mut input = Vec::new();
    let mut commands = Vec::new();
    let mut buf = [0u8; 4096];
    while commands.len() < n {
        let read = peer.read(&mut buf).await.expect("peer read");
        assert!(
            read > 0,
            "the connection closed after {} commands",
            commands.len()
        );
        input.extend_from_slice(&buf[..read]);
        while let Some(len) = frame_len(&input).expect("a well-formed command") {
            let command: Vec<u8> = input.drain(..len).collect();
            match into_value(&command).expect("a command") {
                Value::Array(args) => match args.last() {
                    Some(Value::BulkString(last)) => commands.push(last.clone()),
                    other => panic!("argument {other:?}"),
                },
                other => panic!("command {other:?}"),
            }
        }
    }
    commands
}

fn echo(arg: &str) -> Cmd {
    let mut cmd = redis::cmd("ECHO");
    cmd.arg(arg);
    cmd
}

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn replies_reach_their_requests_in_order_however_they_arrive_cut() {
    let (wire, mut peer) = pair().await;
    let requests = 40;
    let calls: Vec<_> = (0..requests)
        .map(|i| {
            let wire = wire.clone();
            tokio::spawn(async move {
                // One in ten asks for a reply longer than the read buffer.
                let arg = if i % 10 == 3 {
                    format!("{i}:{}", "x".repeat(3 * READ_CHUNK))
                } else {
                    i.to_string()
                };
                let frame = wire.call(&echo(&arg)).await.expect("a reply");
                (arg, frame)
            })
        })
        .collect();
    let commands = read_commands(&mut peer, requests).await;
    let mut replies = Vec::new();
    for arg in &commands {
        replies.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        replies.extend_from_slice(arg);
        replies.extend_from_slice(b"\r\n");
    }
    // Written in pieces of every size from 1 to 97 bytes, each flushed on
    // its own, so replies arrive split at every kind of boundary.
    let mut at = 0;
    let mut size = 1;
    while at < replies.len() {
        let end = (at + size).min(replies.len());
        peer.write_all(&replies[at..end]).await.expect("peer write");
        peer.flush().await.expect("peer flush");
        at = end;
        size = size % 97 + 1;
        if size % 13 == 0 {
            tokio::task::yield_now().await;
        }
    }
    for call in calls {
        let (arg, frame) = tokio::time::timeout(WAIT, call)
            .await
            .expect("answered in time")
            .expect("the task");
        assert_eq!(
            frame.value().expect("a value"),
            Value::BulkString(arg.clone().into_bytes()),
            "the reply to {:.20}",
            arg
        );
    }
}

#[tokio::test]
async fn an_error_reply_is_a_frame_and_the_connection_goes_on() {
    let (wire, mut peer) = pair().await;
    let first = tokio::spawn({
        let wire = wire.clone();
        async move { wire.call(&echo("a")).await }
    });
    read_commands(&mut peer, 1).await;
    peer.write_all(b"-READONLY You can't write against a read only replica.\r\n")
        .await
        .expect("peer write");
    let frame = first.await.expect("task").expect("a frame");
    assert!(frame.is_error());
    let error = frame.value().expect_err("an error reply");
    assert_eq!(error.code(), Some("READONLY"));

    let second = tokio::spawn({
        let wire = wire.clone();
        async move { wire.call(&echo("b")).await }
    });
    read_commands(&mut peer, 1).await;
    peer.write_all(b"$1\r\nb\r\n").await.expect("peer write");
    let frame = second.await.expect("task").expect("a frame");
    assert!(!frame.is_error());
    assert!(matches!(frame.held(), Held::Bytes(b"$1\r\nb\r\n")));

    // A decision's reply, an array of integers alone, comes back as its
    // integers, the same value redis-rs reads from its bytes.
    let third = tokio::spawn({
        let wire = wire.clone();
        async move { wire.call(&echo("c")).await }
    });
    read_commands(&mut peer, 1).await;
    let ints =
        b"*8\r\n:1\r\n:0\r\n:2\r\n:-7\r\n:1733500000000123\r\n:0\r\n:9223372036854775807\r\n:0\r\n";
    peer.write_all(ints).await.expect("peer write");
    let frame = third.await.expect("task").expect("a frame");
    assert!(matches!(
        frame.held(),
        Held::Ints(&[1, 0, 2, -7, 1733500000000123, 0, i64::MAX, 0])
    ));
    assert_eq!(
        frame.value().expect("a value"),
        into_value(ints).expect("a value")
    );
}

/// Every request waiting when the connection ends gets an error with no
/// Redis code (the caller takes it for a command sent without a confirmed
/// reply, and retires the lane), and so does every request after.
async fn ends_the_connection(peer_does: impl AsyncFnOnce(&mut TcpStream)) {
    let (wire, mut peer) = pair().await;
    let waiting: Vec<_> = (0..3)
        .map(|i| {
            let wire = wire.clone();
            tokio::spawn(async move { wire.call(&echo(&i.to_string())).await })
        })
        .collect();
    read_commands(&mut peer, 3).await;
    peer_does(&mut peer).await;
    for call in waiting {
        let error = tokio::time::timeout(WAIT, call)
            .await
            .expect("failed in time")
            .expect("task")
            .expect_err("no reply");
        assert_eq!(error.code(), None, "{error}");
        assert!(error.is_io_error(), "{error}");
    }
    let later = tokio::time::timeout(WAIT, wire.call(&echo("later")))
        .await
        .expect("failed at once");
    assert!(later
        .expect_err("sent on a closed connection")
        .is_io_error());
}

#[tokio::test]
async fn a_reply_that_breaks_the_framing_ends_the_connection() {
    ends_the_connection(async |peer: &mut TcpStream| {
        // A type RESP2 does not have.
        peer.write_all(b"!3\r\nerr\r\n").await.expect("peer write");
    })
    .await;
}

#[tokio::test]
async fn the_peer_closing_ends_the_connection() {
    ends_the_connection(async |peer: &mut TcpStream| {
        peer.shutdown().await.expect("peer shutdown");
    })
    .await;
}

#[tokio::test]
async fn a_reply_nobody_asked_for_ends_the_connection() {
    let (wire, mut peer) = pair().await;
    peer.write_all(b"+OK\r\n").await.expect("peer write");
    // The connection closes: the peer reads end of stream.
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(WAIT, peer.read(&mut buf))
        .await
        .expect("closed in time")
        .expect("peer read");
    assert_eq!(read, 0);
    let error = wire.call(&echo("after")).await.expect_err("closed");
    assert!(error.is_io_error(), "{error}");
}

#[tokio::test]
async fn dropping_the_last_clone_closes_the_socket() {
    let (wire, mut peer) = pair().await;
    let clone = wire.clone();
    drop(wire);
    // One clone left: still open, and still answering.
    let call = tokio::spawn(async move {
        let frame = clone.call(&echo("x")).await;
        (clone, frame)
    });
    read_commands(&mut peer, 1).await;
    peer.write_all(b"$1\r\nx\r\n").await.expect("peer write");
    let (clone, frame) = call.await.expect("task");
    assert!(matches!(
        frame.expect("a reply").held(),
        Held::Bytes(b"$1\r\nx\r\n")
    ));
    drop(clone);
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(WAIT, peer.read(&mut buf))
        .await
        .expect("closed in time")
        .expect("peer read");
    assert_eq!(read, 0, "the socket stayed open");
}

#[tokio::test]
async fn a_pipeline_gets_its_replies_past_the_offset() {
    let (mut wire, mut peer) = pair().await;
    let call = tokio::spawn(async move {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("INCR").arg("k").cmd("GET").arg("k");
        let values: RedisResult<Vec<Value>> = pipe.query_async(&mut wire).await;
        values
    });
    read_commands(&mut peer, 4).await;
    peer.write_all(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1\r\n$1\r\n1\r\n")
        .await
        .expect("peer write");
    let values = call.await.expect("task").expect("replies");
    assert_eq!(
        values,
        vec![Value::Int(1), Value::BulkString(b"1".to_vec())]
    );
}

#[test]
fn replies_read_as_redis_rs_reads_them() {
    let value = into_value(b"*2\r\n:1\r\n$2\r\nok\r\n").expect("a value");
    assert_eq!(
        value,
        Value::Array(vec![Value::Int(1), Value::BulkString(b"ok".to_vec())])
    );
    let error = into_value(b"-READONLY You can't write against a read only replica.\r\n")
        .expect_err("an error reply");
    assert_eq!(error.code(), Some("READONLY"));
}

/// Requests ready together on one worker queue their commands before the
/// connection's task writes: the first one's wake-up puts the task next
/// in line, and it yields once, behind the others, so all of them go in
/// one write (before, one write each: eight here).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn commands_queued_together_go_out_in_one_write() {
    let (wire, mut peer) = pair().await;
    let requests = 8;
    // Spawned from a task on the worker, so all of them are ready there
    // at once, as requests woken by one read of the listener are.
    let calls = tokio::spawn({
        let wire = wire.clone();
        async move {
            (0..requests)
                .map(|i| {
                    let wire = wire.clone();
                    tokio::spawn(async move { wire.call(&echo(&i.to_string())).await })
                })
                .collect::<Vec<_>>()
        }
    })
    .await
    .expect("the spawning task");
    let commands = read_commands(&mut peer, requests).await;
    let writes = wire
        .handle
        .shared
        .writes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(writes, 1, "{requests} commands ready together");

    let mut replies = Vec::new();
    for arg in &commands {
        replies.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        replies.extend_from_slice(arg);
        replies.extend_from_slice(b"\r\n");
    }
    peer.write_all(&replies).await.expect("peer write");
    for (i, call) in calls.into_iter().enumerate() {
        let frame = tokio::time::timeout(WAIT, call)
            .await
            .expect("answered in time")
            .expect("the task")
            .expect("a reply");
        assert_eq!(
            frame.value().expect("a value"),
            Value::BulkString(i.to_string().into_bytes())
        );
    }
}
