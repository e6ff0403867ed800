use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn flat(per_address: usize) -> Arc<PerPeer> {
    PerPeer::new(Limits {
        per_address,
        per_56: usize::MAX,
    })
}

#[test]
fn each_address_holds_at_most_the_limit_and_gets_places_back() {
    let table = flat(2);
    let a1 = table.try_hold(ip("10.0.0.1")).expect("first");
    let a2 = table.try_hold(ip("10.0.0.1")).expect("second");
    assert_eq!(table.try_hold(ip("10.0.0.1")).err(), Some(Refused::Address));
    // Another address is not affected.
    let b = table.try_hold(ip("10.0.0.2")).expect("another address");
    drop(a1);
    let a3 = table
        .try_hold(ip("::ffff:10.0.0.1"))
        .expect("a place came back");
    assert!(table.try_hold(ip("10.0.0.1")).is_err());
    drop((a2, a3, b));
    assert_eq!(
        table.entries(),
        (0, 0),
        "addresses leave with their last connection"
    );
}

#[test]
fn an_ipv6_client_is_its_slash_64() {
    let table = flat(1);
    let _held = table.try_hold(ip("2001:db8:1:2::1")).expect("first");
    assert_eq!(
        table.try_hold(ip("2001:db8:1:2:ffff::9")).err(),
        Some(Refused::Address)
    );
    assert!(table.try_hold(ip("2001:db8:1:3::1")).is_ok());
}

#[test]
fn four_slash_64s_of_one_slash_56_cannot_refuse_another_slash_56() {
    // The pool's shares as the defaults make them: 256 an address, four
    // times that a /56, in a pool of 10,000.
    let limits = Limits::of_pool(10_000, 256);
    assert_eq!(limits.per_56, 1024);
    let table = PerPeer::new(limits);
    let mut held = Vec::new();
    // A /56 (2001:db8:0:ab00::/56) spread over all its 256 /64s, each
    // taking as many connections as it can.
    let mut refused = [0usize; 2];
    for subnet in 0..=255u16 {
        for host in 0..300u16 {
            let peer = ip(&format!("2001:db8:0:ab{subnet:02x}::{host:x}"));
            match table.try_hold(peer) {
                Ok(place) => held.push(place),
                Err(Refused::Address) => refused[0] += 1,
                Err(Refused::Prefix56) => refused[1] += 1,
            }
        }
    }
    assert_eq!(held.len(), 1024, "the /56 holds four shares in all");
    assert_eq!(refused, [4 * 44, 256 * 300 - 1024 - 4 * 44]);
    // Another customer's /56, even the next one, is served.
    let next = table
        .try_hold(ip("2001:db8:0:ac00::1"))
        .expect("another /56");
    assert!(table.try_hold(ip("2001:db8:0:aa99::1")).is_ok());
    drop(next);
    // A /64 of the full /56 is refused for its /56, until one of its
    // connections ends.
    assert_eq!(
        table.try_hold(ip("2001:db8:0:abff::1")).err(),
        Some(Refused::Prefix56)
    );
    held.pop();
    assert!(table.try_hold(ip("2001:db8:0:abff::1")).is_ok());
}

#[test]
fn a_slash_56_is_counted_whole_and_given_back_whole() {
    let table = PerPeer::new(Limits {
        per_address: 2,
        per_56: 3,
    });
    let a = table.try_hold(ip("2001:db8:0:100::1")).unwrap();
    let b = table.try_hold(ip("2001:db8:0:101::1")).unwrap();
    let c = table.try_hold(ip("2001:db8:0:1ff::1")).unwrap();
    assert_eq!(
        table.try_hold(ip("2001:db8:0:102::1")).err(),
        Some(Refused::Prefix56)
    );
    // A refused /56 took nothing: the /64 refused is not in the table.
    assert_eq!(table.entries(), (3, 1));
    // IPv4 has no /56.
    let v4 = [
        table.try_hold(ip("10.0.0.1")),
        table.try_hold(ip("10.0.0.1")),
    ];
    assert!(v4.iter().all(Result::is_ok));
    drop((a, b, c, v4));
    assert_eq!(table.entries(), (0, 0));
}

#[test]
fn the_pool_bounds_the_slash_56_and_the_address_share_the_slash_56() {
    assert_eq!(
        Limits::of_pool(100, 12),
        Limits {
            per_address: 12,
            per_56: 48
        }
    );
    assert_eq!(Limits::of_pool(100, 40).per_56, 100);
    assert_eq!(Limits::of_pool(100, 100).per_56, 100);
    assert_eq!(Limits::of_pool(1, 1).per_56, 1);
}

#[test]
fn an_uncounted_place_takes_no_share_and_has_heads_of_its_own() {
    let table = flat(1);
    let _counted = table.try_hold(ip("10.0.0.1")).unwrap();
    let uncounted = Held::uncounted();
    let other = Held::uncounted();
    uncounted
        .heads()
        .fetch_add(5, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(other.heads().load(std::sync::atomic::Ordering::Relaxed), 0);
    drop((uncounted, other));
    assert_eq!(table.entries(), (1, 0));
}
