use super::slots::NO_NODE;
use super::*;

fn frame(bytes: &[u8]) -> Frame {
    Frame::from_slice(bytes)
}

fn addr(host: &str, port: u16) -> Addr {
    Addr {
        host: host.to_owned(),
        port,
    }
}

#[test]
fn redirects_are_read_with_their_slot_and_node() {
    assert_eq!(
        Redirect::of(&frame(b"-MOVED 3999 127.0.0.1:6381\r\n")),
        Some(Redirect::Moved {
            slot: 3999,
            addr: Some(addr("127.0.0.1", 6381))
        })
    );
    assert_eq!(
        Redirect::of(&frame(b"-ASK 12 redis-2.svc:7000\r\n")),
        Some(Redirect::Ask {
            slot: 12,
            addr: Some(addr("redis-2.svc", 7000))
        })
    );
    // An IPv6 host keeps its colons; a node that does not know its
    // own host names none.
    assert_eq!(
        Redirect::of(&frame(b"-MOVED 1 ::1:7001\r\n")),
        Some(Redirect::Moved {
            slot: 1,
            addr: Some(addr("::1", 7001))
        })
    );
    assert_eq!(
        Redirect::of(&frame(b"-MOVED 1 :7001\r\n")),
        Some(Redirect::Moved {
            slot: 1,
            addr: None
        })
    );
    for other in [
        &b"-ERR MOVED 1 a:1\r\n"[..],
        b"-MOVED 16384 a:1\r\n",
        b"-MOVED 1 a\r\n",
        b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
        b"+MOVED 1 a:1\r\n",
        b":1\r\n",
    ] {
        assert_eq!(Redirect::of(&frame(other)), None, "{other:?}");
    }
}

#[test]
fn slots_follow_the_hash_tag() {
    // Values Redis's own `CLUSTER KEYSLOT` gives.
    assert_eq!(slot_of(b"foo"), 12182);
    assert_eq!(slot_of(b"bar"), 5061);
    assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
    assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
    assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
    assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
}

#[test]
fn commands_go_to_their_key_every_primary_or_any_node() {
    let to = |words: &[&str]| {
        let mut args = words.iter().map(|w| w.as_bytes());
        let name = args.next().unwrap();
        route(name, args)
    };
    assert_eq!(to(&["FCALL", "f", "1", "foo", "a"]), To::Slot(12182));
    assert_eq!(to(&["evalsha", "abc", "2", "bar", "foo"]), To::Slot(5061));
    assert_eq!(to(&["FCALL", "f", "0", "a"]), To::Any);
    assert_eq!(to(&["FUNCTION", "LOAD", "REPLACE", "x"]), To::Primaries);
    assert_eq!(to(&["function", "delete", "x"]), To::Primaries);
    assert_eq!(to(&["SCRIPT", "LOAD", "x"]), To::Primaries);
    assert_eq!(to(&["FUNCTION", "LIST"]), To::Any);
    assert_eq!(to(&["PING"]), To::Any);
    assert_eq!(to(&["INFO", "server"]), To::Any);
    assert_eq!(to(&["GET", "foo"]), To::Slot(12182));
    assert_eq!(to(&["TOUCH", "bar"]), To::Slot(5061));
}

fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

fn range(first: i64, last: i64, host: &str, port: i64) -> Value {
    Value::Array(vec![
        Value::Int(first),
        Value::Int(last),
        Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
        // A replica: not used.
        Value::Array(vec![bulk("10.0.0.9"), Value::Int(1), bulk("r")]),
    ])
}

#[test]
fn the_slot_map_names_each_ranges_primary() {
    let asked = addr("10.0.0.1", 7000);
    let reply = Value::Array(vec![
        range(0, 5460, "10.0.0.1", 7000),
        range(5461, 10922, "", 7001),
        range(10923, 16383, "10.0.0.3", 7002),
        range(100, 100, "10.0.0.3", 7002),
    ]);
    let map = Map::parse(&reply, &asked).expect("parsed");
    let at = |slot: usize| &map.nodes[usize::from(map.slots[slot])].addr;
    assert_eq!(at(0), &addr("10.0.0.1", 7000));
    assert_eq!(at(99), &addr("10.0.0.1", 7000));
    assert_eq!(at(100), &addr("10.0.0.3", 7002));
    // An empty host is the node asked.
    assert_eq!(at(5461), &addr("10.0.0.1", 7001));
    assert_eq!(at(16383), &addr("10.0.0.3", 7002));
    assert_eq!(map.nodes.len(), 3);
    assert!(map.nodes.iter().all(|n| n.serves));

    // A slot no range covers has no node.
    let partial = Value::Array(vec![range(0, 10, "a", 1)]);
    let map = Map::parse(&partial, &asked).expect("parsed");
    assert_eq!(map.slots[11], NO_NODE);

    for bad in [
        Value::Int(1),
        Value::Array(vec![range(5, 4, "a", 1)]),
        Value::Array(vec![range(0, 16384, "a", 1)]),
        Value::Array(vec![range(0, 1, "a", 70000)]),
        Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(1)])]),
    ] {
        assert!(Map::parse(&bad, &asked).is_none(), "{bad:?}");
    }
}
