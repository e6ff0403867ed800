//! What an explanation says of a route's `deny` and `exempt`: the
//! networks are the operator's, shown as written; the client address
//! never is.

use serde_json::{json, Value};

use crate::route::Route;

/// The answer to a request the route's `deny` refuses.
pub(super) fn denied(route: &Route) -> Value {
    json!({
        "status": 403,
        "outcome": "address_denied",
        "forwarded": false,
        "why": "the client address is in the route's `deny` networks: answered 403 before any limit, nothing forwarded (counted in sluice_requests_denied_total)",
        "route": &*route.name,
        "policy": null,
    })
}

/// One limit the client address is exempt from.
pub(super) fn exempt(route: &Route, limit: usize) -> Value {
    let networks: Vec<String> = route
        .addresses
        .exempt_from(limit)
        .iter()
        .map(ToString::to_string)
        .collect();
    json!({
        "policy": &**route.limits[limit].policy.name(),
        "exempt": true,
        "exempt_networks": networks,
        "why": "the client address is in this limit's `exempt` networks: the limit is skipped, nothing is charged (counted in sluice_requests_exempted_total)",
    })
}
