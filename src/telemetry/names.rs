//! Every metric sluice exports: name, type and help text, in one table.
//!
//! The recorder describes each counter and gauge from [`ALL`], and
//! [`super::histogram`] renders each histogram with its help; the code that
//! counts registers its handles once, from these
//! names, where it lives (the proxy per route at load, the Redis store,
//! the reloader, the listener).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// Always in seconds, with [`super::SECONDS_BUCKETS`] ([`super::histogram`]).
    Histogram,
}

#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

impl Metric {
    const fn counter(name: &'static str, help: &'static str) -> Metric {
        Metric {
            name,
            kind: Kind::Counter,
            help,
        }
    }

    const fn gauge(name: &'static str, help: &'static str) -> Metric {
        Metric {
            name,
            kind: Kind::Gauge,
            help,
        }
    }

    const fn seconds(name: &'static str, help: &'static str) -> Metric {
        Metric {
            name,
            kind: Kind::Histogram,
            help,
        }
    }

    pub(super) fn describe(&self) {
        use metrics::{describe_counter, describe_gauge};
        match self.kind {
            Kind::Counter => describe_counter!(self.name, self.help),
            Kind::Gauge => describe_gauge!(self.name, self.help),
            // Rendered by `super::histogram`, which writes the help itself.
            Kind::Histogram => {}
        }
    }
}

// Labels are bounded: route, policy, outcome, store, source, command, kind,
// result, reason, status_class, hash, version. Never a subject, a pseudonym or anything a
// client chose.

pub const REQUESTS: &str = "sluice_requests_total";
pub const REQUESTS_REFUSED: &str = "sluice_requests_refused_total";
pub const REQUESTS_EXEMPTED: &str = "sluice_requests_exempted_total";
pub const REQUESTS_DENIED: &str = "sluice_requests_denied_total";
pub const DECISION_DURATION: &str = "sluice_decision_duration_seconds";
pub const FORWARDED_WITHOUT_DECISION: &str = "sluice_forwarded_without_decision_total";
pub const UPSTREAM_RESPONSES: &str = "sluice_upstream_responses_total";
pub const UPSTREAM_ERRORS: &str = "sluice_upstream_errors_total";
pub const UPSTREAM_DURATION: &str = "sluice_upstream_duration_seconds";
pub const UPSTREAM_RESENDS: &str = "sluice_upstream_resends_total";
pub const REQUEST_BODIES_CUT: &str = "sluice_request_bodies_cut_total";
pub const STORE_ERRORS: &str = "sluice_store_errors_total";
pub const STORE_RETRIES: &str = "sluice_store_retries_total";
pub const STORE_EVENTS: &str = "sluice_store_events_total";
pub const BREAKER_OPEN: &str = "sluice_store_breaker_open";
pub const BREAKER_OPENED: &str = "sluice_store_breaker_opened_total";
pub const REDIS_CALLS: &str = "sluice_redis_calls_total";
pub const REDIS_CALL_DURATION: &str = "sluice_redis_call_duration_seconds";
pub const REDIS_BATCHES: &str = "sluice_redis_batches_total";
pub const REDIS_BATCHED: &str = "sluice_redis_batched_decisions_total";
pub const SCRIPT_LOADS: &str = "sluice_store_script_loads_total";
pub const DEDUPE_HITS: &str = "sluice_store_dedupe_hits_total";
pub const REFUNDS: &str = "sluice_refunds_total";
pub const DENY_CACHE_HITS: &str = "sluice_local_deny_cache_hits_total";
pub const STORE_FALLBACK: &str = "sluice_store_fallback";
pub const STORE_FALLBACK_SECONDS: &str = "sluice_store_fallback_seconds_total";
pub const STORE_FALLBACKS: &str = "sluice_store_fallbacks_total";
pub const MEMORY_SUBJECTS: &str = "sluice_memory_store_subjects";
pub const MEMORY_EVICTIONS: &str = "sluice_memory_store_evictions_total";
pub const IN_FLIGHT: &str = "sluice_in_flight_requests";
pub const CONFIG_RELOADS: &str = "sluice_config_reloads_total";
pub const CONFIG_REVISION: &str = "sluice_config_revision";
pub const CONFIG_INFO: &str = "sluice_config_info";
pub const BUILD_INFO: &str = "sluice_build_info";
pub const CONNECTIONS_REFUSED: &str = "sluice_connections_refused_total";
pub const HEAD_BUDGET_REFUSED: &str = "sluice_head_budget_refused_total";
pub const HEAD_BYTES_HELD: &str = "sluice_head_bytes_held";
pub const REQUEST_BODY_BYTES_BUFFERED: &str = "sluice_request_body_bytes_buffered";
pub const REQUEST_BODIES_STREAMED: &str = "sluice_request_bodies_streamed_total";
pub const PROXY_PROTOCOL_HEADERS: &str = "sluice_proxy_protocol_headers_total";
pub const PROXY_PROTOCOL_REJECTED: &str = "sluice_proxy_protocol_rejected_total";
pub const FORWARDED_FOR_IGNORED: &str = "sluice_forwarded_for_ignored_total";
pub const UNDECODABLE_CREDENTIALS: &str = "sluice_undecodable_credentials_total";
pub const JWT_REJECTED: &str = "sluice_jwt_rejected_total";
pub const REQUESTS_DELAYED: &str = "sluice_requests_delayed_total";
pub const REQUEST_DELAY: &str = "sluice_request_delay_seconds";
pub const LEASES_GRANTED: &str = "sluice_leases_granted_total";
pub const LEASES_RETURNED: &str = "sluice_leases_returned_total";
pub const LEASE_UNITS_RETURNED: &str = "sluice_lease_units_returned_total";
pub const LEASE_ADMITTED: &str = "sluice_lease_admitted_total";
pub const LEASE_UNITS_HELD: &str = "sluice_lease_units_held";
pub const RUNTIME_ALIVE_TASKS: &str = "sluice_runtime_alive_tasks";
pub const NEAR_LIMIT: &str = "sluice_near_limit_total";
pub const RESPONSE_CHARGES: &str = "sluice_response_charges_total";
pub const RESPONSE_COST_FALLBACKS: &str = "sluice_response_cost_fallbacks_total";

pub const ALL: &[Metric] = &[
    Metric::counter(REQUESTS, "Requests by route, policy and decision outcome."),
    Metric::counter(
        REQUESTS_REFUSED,
        "Malformed requests refused before routing (400/501), by reason.",
    ),
    Metric::counter(
        REQUESTS_EXEMPTED,
        "Requests that skipped a limit because their client address is in its `exempt` networks, by route and policy.",
    ),
    Metric::counter(
        REQUESTS_DENIED,
        "Requests answered 403 because their client address is in the route's `deny` networks, by route; never forwarded, never counted against a limit.",
    ),
    Metric::counter(
        STORE_RETRIES,
        "Indeterminate store calls retried with the same evaluation id.",
    ),
    Metric::counter(STORE_EVENTS, "Store conditions recovered from, by kind."),
    Metric::counter(BREAKER_OPENED, "Times the store breaker opened."),
    Metric::seconds(
        DECISION_DURATION,
        "Time to reach a decision, once per request with a rate limit, by store and where it was made (source: store, deny_cache, lease, local, failed).",
    ),
    Metric::counter(STORE_ERRORS, "Store failures by kind."),
    Metric::gauge(BREAKER_OPEN, "1 while the store breaker is open."),
    Metric::counter(
        SCRIPT_LOADS,
        "Lua scripts loaded into Redis, as Functions libraries or cached scripts (start, and after function not found or NOSCRIPT).",
    ),
    Metric::counter(
        REDIS_CALLS,
        "Commands sent to Redis on sluice's connections, counted when their reply came or the wait for it ended, by command (fcall, evalsha, function_load, script_load, touch, other) and result (ok, error, timeout, connection_lost).",
    ),
    Metric::seconds(
        REDIS_CALL_DURATION,
        "Time from sending a command to Redis to its reply (or to giving up on it), by command; a pipeline of TOUCHes is one round trip.",
    ),
    Metric::counter(
        REDIS_BATCHES,
        "Batches sent to Redis: one call deciding several evaluations at once (store.coalesce: on), made of decisions that arrived while a call was in flight; its retry is not counted again.",
    ),
    Metric::counter(
        REDIS_BATCHED,
        "Evaluations decided in those calls; divided by sluice_redis_batches_total, the mean decisions per batched call.",
    ),
    Metric::counter(
        DEDUPE_HITS,
        "Retried evaluations answered from the recorded decision.",
    ),
    Metric::counter(
        REFUNDS,
        "Charges given back on Redis Cluster when another limit of the request refused it, by result.",
    ),
    Metric::counter(
        FORWARDED_WITHOUT_DECISION,
        "Requests forwarded without a decision (on_failure: allow; never under local).",
    ),
    Metric::counter(
        UPSTREAM_RESPONSES,
        "Responses of the app passed to the client, by route and status class.",
    ),
    Metric::counter(
        UPSTREAM_ERRORS,
        "Forwarded requests that got sluice's own answer instead of the app's (502, 504, 408, 400), by route and kind.",
    ),
    Metric::seconds(
        UPSTREAM_DURATION,
        "Time to the upstream's response head, by route.",
    ),
    Metric::counter(
        UPSTREAM_RESENDS,
        "Requests sent again on a new connection: the reused one was closed by the app.",
    ),
    Metric::counter(
        REQUEST_BODIES_CUT,
        "Request bodies sluice cut short because the client sent them too slowly, by reason (body_idle_timeout, min_upload_rate).",
    ),
    Metric::counter(CONFIG_RELOADS, "Configuration reloads by result."),
    Metric::gauge(
        CONFIG_REVISION,
        "Number of configurations loaded since start (1 = the initial one).",
    ),
    Metric::gauge(
        CONFIG_INFO,
        "1 for the configuration serving now, by content hash.",
    ),
    Metric::gauge(
        BUILD_INFO,
        "Always 1; the version label says which sluice runs.",
    ),
    Metric::gauge(
        STORE_FALLBACK,
        "1 while this sidecar decides alone because the store cannot (on_failure: local).",
    ),
    Metric::counter(
        STORE_FALLBACK_SECONDS,
        "Whole seconds spent deciding alone (on_failure: local).",
    ),
    Metric::counter(
        STORE_FALLBACKS,
        "Times this sidecar started deciding alone (on_failure: local).",
    ),
    Metric::gauge(MEMORY_SUBJECTS, "Subjects tracked by the embedded store."),
    Metric::counter(
        MEMORY_EVICTIONS,
        "Entries the full embedded store evicted to admit new subjects.",
    ),
    Metric::gauge(
        IN_FLIGHT,
        "Requests in flight to the upstream under each concurrency policy, every subject together.",
    ),
    Metric::gauge(
        RUNTIME_ALIVE_TASKS,
        "Tasks alive in the async runtime (connections, requests in flight, background work), read at each scrape.",
    ),
    Metric::counter(
        CONNECTIONS_REFUSED,
        "Traffic connections closed at once: server.max_connections were open, or max_connections_per_ip from the client's address, or four times that from its IPv6 /56 (label limit).",
    ),
    Metric::counter(
        HEAD_BUDGET_REFUSED,
        "Request heads refused (HTTP/2 streams answered 503, HTTP/1 connections answered 503 and closed) because they would have taken the connection, the client address or the process past server.request_heads (label reason: connection, client, total).",
    ),
    Metric::gauge(
        HEAD_BYTES_HELD,
        "Bytes of request heads held now, as server.request_heads counts them (HTTP/1 heads still arriving, HTTP/2 header lists of open streams).",
    ),
    Metric::gauge(
        REQUEST_BODY_BYTES_BUFFERED,
        "Bytes of request bodies held now, received before their requests take a place in flight (server.request_buffering).",
    ),
    Metric::counter(
        REQUEST_BODIES_STREAMED,
        "Request bodies of requests under a concurrency limit that streamed instead of being received whole, by reason (max_body: larger than server.request_buffering.max_body; total: the budget was full).",
    ),
    Metric::counter(
        PROXY_PROTOCOL_HEADERS,
        "PROXY protocol headers read from trusted peers, by version.",
    ),
    Metric::counter(
        PROXY_PROTOCOL_REJECTED,
        "Connections from trusted peers closed for their PROXY protocol header, by reason (malformed, too_long, version, timeout).",
    ),
    Metric::counter(
        FORWARDED_FOR_IGNORED,
        "Requests with X-Forwarded-For from a private or loopback peer while identity.trusted_proxies is empty: the header was ignored and every client behind that proxy shares its address.",
    ),
    Metric::counter(
        UNDECODABLE_CREDENTIALS,
        "Requests whose Authorization: Basic credential decodes to nothing (or reads differently in different app servers), counted in the route's one shared bucket for them, by route.",
    ),
    Metric::counter(
        REQUESTS_DELAYED,
        "Requests past a GCRA or token-bucket policy's burst held for their turn (`delay`) instead of refused, by route and policy.",
    ),
    Metric::seconds(
        REQUEST_DELAY,
        "How long each delayed request waited for its turn, by route and policy.",
    ),
    Metric::counter(
        JWT_REJECTED,
        "Requests whose bearer token a `jwt:` subject or claim tier read and did not believe, by reason (malformed, algorithm, unknown_key, signature, expired, not_yet_valid, issuer, audience, claims): each limit fell to its next subject.",
    ),
    Metric::counter(
        DENY_CACHE_HITS,
        "Requests denied by the local over-limit cache without asking the store.",
    ),
    Metric::counter(
        LEASES_GRANTED,
        "Leases taken: blocks of a hot subject's quota charged in Redis at once, to spend here.",
    ),
    Metric::counter(
        LEASES_RETURNED,
        "Leases whose unspent units Redis took back (on expiry, drain or a reload), by result.",
    ),
    Metric::counter(
        LEASE_UNITS_RETURNED,
        "Units of leases given back to Redis unspent.",
    ),
    Metric::counter(
        LEASE_ADMITTED,
        "Requests admitted from a lease, without a store call.",
    ),
    Metric::gauge(
        LEASE_UNITS_HELD,
        "Units held in this sidecar's leases, charged in Redis and not yet spent.",
    ),
    Metric::counter(
        NEAR_LIMIT,
        "Admitted requests that left less than the policy's near-limit share of its quota unused, by route and policy.",
    ),
    Metric::counter(
        RESPONSE_CHARGES,
        "Charges made once the response head arrived, by route, policy and result.",
    ),
    Metric::counter(
        RESPONSE_COST_FALLBACKS,
        "Responses whose cost header was missing, invalid or above `max`, by route, policy and reason.",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_prometheus_conventions_and_appear_once() {
        for (i, metric) in ALL.iter().enumerate() {
            assert!(metric.name.starts_with("sluice_"), "{}", metric.name);
            let total = metric.name.ends_with("_total");
            assert_eq!(total, metric.kind == Kind::Counter, "{}", metric.name);
            if metric.kind == Kind::Histogram {
                assert!(metric.name.ends_with("_seconds"), "{}", metric.name);
            }
            assert!(
                ALL[..i].iter().all(|m| m.name != metric.name),
                "{} twice",
                metric.name
            );
        }
    }
}
