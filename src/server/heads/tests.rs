use super::*;
use crate::server::per_peer::{self, PerPeer};

fn peers(per_address: usize) -> std::sync::Arc<PerPeer> {
    PerPeer::new(per_peer::Limits::of_pool(1000, per_address))
}

fn limits() -> Limits {
    Limits {
        per_connection: 100,
        per_client: 150,
        total: 200,
    }
}

#[test]
fn each_budget_refuses_what_would_go_past_it_and_charges_nothing_then() {
    let budget = Budget::new(limits());
    let peers = peers(10);
    let a1 = budget.connection(peers.try_hold("10.0.0.1".parse().unwrap()).unwrap());
    let a2 = budget.connection(peers.try_hold("10.0.0.1".parse().unwrap()).unwrap());
    let b = budget.connection(peers.try_hold("10.0.0.2".parse().unwrap()).unwrap());

    let first = a1.charge(60).expect("within every budget");
    assert_eq!(a1.charge(41).err(), Some(Over::Connection));
    // A second connection of the same address shares the client's budget.
    let second = a2.charge(90).expect("150 for the client");
    assert_eq!(a2.charge(1).err(), Some(Over::Client));
    // Another address: its own client budget, the process's total.
    assert_eq!(b.charge(51).err(), Some(Over::Total));
    let third = b.charge(50).expect("the total's last 50");
    assert_eq!(budget.held(), 200);

    // A refusal took nothing; what is given back is free again.
    drop(first);
    assert_eq!(budget.held(), 140);
    let again = a1.charge(60).expect("given back");
    drop((again, second, third));
    assert_eq!(budget.held(), 0);
    assert_eq!(a1.held.load(Ordering::Relaxed), 0);
    assert_eq!(a1.place.heads().load(Ordering::Relaxed), 0);
}

#[test]
fn a_charge_grows_as_a_head_arrives_and_stays_as_it_was_when_refused() {
    let budget = Budget::new(limits());
    let peers = peers(10);
    let conn = budget.connection(peers.try_hold("192.0.2.1".parse().unwrap()).unwrap());
    let mut charge = conn.charge(10).unwrap();
    charge.grow(80).unwrap();
    assert_eq!(charge.bytes(), 90);
    assert_eq!(charge.grow(11), Err(Over::Connection));
    assert_eq!(charge.bytes(), 90);
    assert_eq!(budget.held(), 90);
    drop(charge);
    assert_eq!(budget.held(), 0);
}

#[test]
fn a_charge_keeps_its_connection_place_until_it_is_given_back() {
    let budget = Budget::new(limits());
    let peers = peers(1);
    let ip = "2001:db8::1".parse().unwrap();
    let conn = budget.connection(peers.try_hold(ip).unwrap());
    let charge = conn.charge(10).unwrap();
    // The connection's task ended; one of its HTTP/2 streams runs on.
    drop(conn);
    assert!(
        peers.try_hold("2001:db8::2".parse().unwrap()).is_err(),
        "the /64 still holds its one connection"
    );
    drop(charge);
    assert!(peers.try_hold(ip).is_ok());
}

#[test]
fn a_header_list_is_sized_as_http2_counts_it() {
    let request = http::Request::builder()
        .method("GET")
        .uri("https://example.com/a?b")
        .header("x-pad", "12345")
        .body(())
        .unwrap();
    // :method GET, :scheme https, :authority example.com, :path /a?b,
    // x-pad 12345: names and values, and 32 each.
    let expected = (7 + 3) + (7 + 5) + (10 + 11) + (5 + 4) + (5 + 5) + 5 * 32;
    assert_eq!(header_list_size(&request), expected);
}
