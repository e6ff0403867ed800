//! `POST /explain` and `sluice check --explain`: for a described request,
//! the route it matches, each limit's subject (as a pseudonym only),
//! policy and state, and what sluice would answer it now, charging nothing.
//!
//! Nothing here re-implements the request path: the routing half is the
//! proxy's own [`service::prepare`], the state is read with
//! [`Store::peek`] (the same algorithm step, its result not written), and
//! the answer is the proxy's own planner ([`plan::plan`]) applied to those
//! outcomes, each limit's own by the same [`plan::decide`]; the local
//! fallback is read, not charged. Only the counting is left out: an
//! explanation is not a request and appears in no request metric.
//!
//! The output never holds a raw identity: no header value, no peer, no
//! client address; subjects appear as the pseudonyms the stores key by.

mod addresses;
mod request;

#[cfg(test)]
mod tests;

use std::time::Duration;

use http::{StatusCode, Version};
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::config::Live;
use crate::limit::{Decision, LimitPolicy, Outcome, Policy, Unavailable};
use crate::path;
use crate::route::{SubjectSource, TierBy, Unmet};
use crate::store::lease::HeldView;
use crate::store::{Outcomes, Store};
use crate::subject::jwt::Token;
use crate::subject::{Pseudonym, Resolved};

use super::fallback::Fallback;
use super::headers::Invalid;
use super::respond;
use super::runtime::Runtime;
use super::service::plan::{self, Action, Judgement, Rated, Step};
use super::service::{self, Check, Destination};
use super::verdict::{Failure, Verdict};

pub use request::{BadDescription, Described, DEFAULT_PEER, MAX_BODY};

/// Where the state comes from.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// The running sidecar's store and local fallback, read without
    /// charging.
    Store(&'a Store, &'a Fallback),
    /// `sluice check --explain`: routing only, no store asked, and the
    /// pseudonym key only known when the configuration sets it.
    Offline,
}

/// What a real request would be answered now.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: StatusCode,
    /// The `outcome` it would be counted under.
    outcome: &'static str,
    forwarded: bool,
    why: String,
    /// Of an answer sluice gives itself: its `Content-Type` and the names
    /// of its fields, as a client would get them (a route's own
    /// `responses.refused` or `unavailable`, a policy's `headers: off`).
    response: Option<Value>,
}

impl Answer {
    fn json(&self) -> Value {
        let mut out = json!({
            "status": self.status.as_u16(),
            "outcome": self.outcome,
            "forwarded": self.forwarded,
            "why": self.why,
        });
        if let (Value::Object(map), Some(response)) = (&mut out, &self.response) {
            map.insert("response".to_owned(), response.clone());
        }
        out
    }
}

/// What the client of an answer sluice gives itself would read of it.
fn answered(response: &http::Response<super::body::Body>) -> Value {
    let headers = response.headers();
    let fields: Vec<&str> = headers.keys().map(|name| name.as_str()).collect();
    json!({
        "content_type": headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        "fields": fields,
    })
}

/// The explanation of `described` under `runtime`, as JSON.
pub async fn explain(runtime: &Runtime, source: Source<'_>, described: &Described) -> Value {
    let live = &*runtime.live;
    let mut out = Map::new();
    let mut request = json!({
        "method": described.method.as_str(),
        "path": described.uri.path(),
        "peer_given": described.peer_given,
    });
    // What `jwt:` subjects and claim tiers make of the bearer token.
    let token = Token::new(live.identity.jwt.as_deref(), &described.headers);
    if let (Some(verdict), Value::Object(map)) = (token.verdict(), &mut request) {
        let said = match verdict {
            Ok(()) => "verified".to_owned(),
            Err(reason) => format!("rejected: {}", reason.label()),
        };
        map.insert("token".to_owned(), json!(said));
    }
    out.insert("request".to_owned(), request);
    let routed = service::prepare(
        runtime,
        &described.method,
        Version::HTTP_11,
        &described.uri,
        &described.headers,
        described.peer,
    );
    let routed = match routed {
        Ok(Destination::Routes(routed)) => routed,
        Ok(Destination::Sluice) => {
            out.insert("answer".to_owned(), answered_by_sluice());
            return Value::Object(out);
        }
        Ok(Destination::Denied(entry)) => {
            out.insert("denied".to_owned(), json!(&*entry.route.name));
            out.insert("answer".to_owned(), addresses::denied(entry.route));
            return Value::Object(out);
        }
        Err(invalid) => {
            let (refused, answer) = refused(&invalid);
            out.insert("refused".to_owned(), refused);
            out.insert("answer".to_owned(), answer);
            return Value::Object(out);
        }
    };

    // Normalization ran inside `prepare` and succeeded there; run again
    // only to show what it found.
    let matching = path::normalize(described.uri.path(), &live.server.paths)
        .ok()
        .map(|normal| {
            out.insert("path".to_owned(), json!(&*normal.forward));
            normal.matching.into_owned()
        });
    let methods: Vec<&http::Method> = routed.methods.iter().collect();
    // `prepare` read them without error.
    let facts = service::facts(runtime, &described.uri, &described.headers).unwrap_or_default();
    out.insert("matched_as".to_owned(), json!(matching));
    // Routes before the one found whose methods and path matched but
    // whose conditions did not: the condition each failed (names only,
    // never a value).
    if let Some(matching) = &matching {
        let found = runtime.routes.find(&described.method, matching, &facts);
        let passed_over: Vec<Value> = runtime.routes.routes()[..found]
            .iter()
            .filter(|r| r.matcher.matches(&described.method, matching))
            .filter_map(|r| {
                let unmet = match r.matcher.conditions.unmet(&facts)? {
                    Unmet::Host => "host".to_owned(),
                    Unmet::Header(name) => format!("header {name}"),
                    Unmet::Query(name) => format!("query {name}"),
                };
                Some(json!({ "route": &*r.name, "unmet": unmet }))
            })
            .collect();
        if !passed_over.is_empty() {
            out.insert("passed_over".to_owned(), Value::Array(passed_over));
        }
    }
    out.insert(
        "runs_as".to_owned(),
        json!(methods.iter().map(|m| m.as_str()).collect::<Vec<_>>()),
    );

    // Each rate limit as the store would answer it now, charging nothing.
    let deadline = Instant::now() + live.store.budget;
    let (limits, evaluations) = plan::asked(&routed.checks, deadline, live.upstream.timeout);
    let rated = plan::rated(&limits, &evaluations);
    // A request every limit of which a lease held here pays for is
    // answered from them, with no store call: so is this one.
    let leases: Vec<Option<HeldView>> = match source {
        Source::Store(store, _) => evaluations.iter().map(|e| store.lease(e)).collect(),
        Source::Offline => Vec::new(),
    };
    let from_leases = !leases.is_empty() && leases.iter().all(Option::is_some);
    let read = match source {
        Source::Store(store, fallback) => {
            let mut outcomes = Outcomes::empty();
            for (evaluation, lease) in evaluations.iter().zip(&leases) {
                let outcome = match lease {
                    Some(lease) if from_leases => Outcome::Allowed(lease.answer),
                    _ => store.peek(evaluation).await,
                };
                outcomes.list.push(outcome);
            }
            Some((store, fallback, outcomes))
        }
        Source::Offline => None,
    };

    let mut routes = Vec::new();
    for (route_at, entry) in routed.matched.iter().enumerate() {
        let route = entry.route;
        let mut limits = Vec::new();
        for check in routed.checks.iter().filter(|c| c.route_at == route_at) {
            let peeked = read.as_ref().and_then(|(store, fallback, outcomes)| {
                let (at, (limit, outcome)) = rated
                    .iter()
                    .zip(&outcomes.list)
                    .enumerate()
                    .find(|(_, (limit, _))| std::ptr::eq(limit.check, check))?;
                Some((*store, *fallback, limit, *outcome))
                    .map(|peeked| (peeked, leases.get(at).copied().flatten()))
            });
            let lease = peeked.and_then(|(_, lease)| lease);
            let mut json = limit(check, live, source, peeked.map(|(p, _)| p));
            if let (Value::Object(map), Some(lease)) = (&mut json, lease) {
                map.insert(
                    "lease".to_owned(),
                    json!({
                        "units": lease.units,
                        "seconds_left": seconds(lease.lasts),
                        "answers": from_leases,
                    }),
                );
            }
            limits.push(json);
        }
        for &(exempt, at) in &routed.exempted {
            if std::ptr::eq(exempt.route, route) {
                limits.push(addresses::exempt(route, at));
            }
        }
        let found_by: Vec<&str> = match &matching {
            Some(matching) => methods
                .iter()
                .filter(|m| std::ptr::eq(runtime.routes.route_for(m, matching, &facts), route))
                .map(|m| m.as_str())
                .collect(),
            None => vec![described.method.as_str()],
        };
        let mut json = json!({
            "route": &*route.name,
            "methods": found_by,
            // The first limit's; each limit says its own.
            "cost": route.limits.first().map_or(1, |l| l.cost),
            "limits": limits,
        });
        if let (Some(tiers), Value::Object(map)) = (&route.tiers, &mut json) {
            // `trusted`: the peer is in the tiers' `trusted_from`.
            let trusted = tiers.believes(described.peer);
            let token = Token::new(live.identity.jwt.as_deref(), &described.headers);
            let tier = tiers.choose(&described.headers, described.peer, &token);
            let values: Map<String, Value> = tiers
                .values
                .iter()
                .map(|(v, t)| (v.to_string(), json!(&*tiers.names[usize::from(*t)])))
                .collect();
            let mut described_tiers = json!({
                "policies": values,
                "default": &*tiers.names[usize::from(tiers.default)],
                "chosen": &*tiers.names[usize::from(tier)],
            });
            if let Value::Object(t) = &mut described_tiers {
                match &tiers.by {
                    TierBy::Header { name, trusted_from } => {
                        t.insert("header".to_owned(), json!(name.as_str()));
                        t.insert(
                            "trusted_from".to_owned(),
                            json!(trusted_from
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()),
                        );
                        t.insert("trusted".to_owned(), json!(trusted));
                    }
                    TierBy::Claim(claim) => {
                        t.insert("claim".to_owned(), json!(&**claim));
                        if let Some(reason) = token.rejected() {
                            t.insert("token_rejected".to_owned(), json!(reason.label()));
                        }
                    }
                }
            }
            map.insert("tiers".to_owned(), described_tiers);
        }
        routes.push(json);
    }
    out.insert("routes".to_owned(), Value::Array(routes));

    // The proxy's own rule, applied to what was read: concurrency limits
    // answer as if a place were free.
    let answer = match read {
        None => json!({
            "why": "offline: no store was asked; a running sidecar's POST /explain gives the state and the answer",
        }),
        Some((_, fallback, outcomes)) => {
            let plan = service::plan::plan(&rated, &outcomes, live);
            let asked: Vec<_> = plan.locals().collect();
            let (local, shared) = fallback.peek_all(&asked, live.store.local_share);
            let judged = match plan.settle(&local, &shared, live) {
                Judgement::Refused(refusal) => {
                    let check = refusal.check;
                    let route = &check.entry.route.name;
                    let policy = Some(&**check.limit().policy.name());
                    let answer = answer(Some(&refusal.response), &refusal.verdict, live);
                    (answer, route, policy)
                }
                Judgement::Passed(passed) => {
                    // As its first route counts it.
                    let entry = routed.matched.primary();
                    let (at, verdict) = passed.counted(0, &routed.checks);
                    let policy = entry.route.limits.get(at).map(|l| &**l.policy.name());
                    (answer(None, &verdict, live), &entry.route.name, policy)
                }
            };
            let (answer, route, policy) = judged;
            let mut json = answer.json();
            if let Value::Object(map) = &mut json {
                map.insert("route".to_owned(), json!(&**route));
                map.insert("policy".to_owned(), json!(policy));
                map.insert("from_lease".to_owned(), json!(from_leases));
            }
            json
        }
    };
    out.insert("answer".to_owned(), answer);
    Value::Object(out)
}

/// Explains one limit: the policy, the subject as it resolved, and, from
/// a running sidecar, the state `peeked` (read without charging) and what
/// it would answer. A concurrency limit's state is this process's, not the
/// store's: it is shown without one.
fn limit(
    check: &Check<'_>,
    live: &Live,
    source: Source<'_>,
    peeked: Option<(&Store, &Fallback, &Rated<'_, '_, '_>, Outcome)>,
) -> Value {
    let limit = check.limit();
    let mut out = Map::new();
    out.insert("policy".to_owned(), json!(&**limit.policy.name()));
    out.insert("cost".to_owned(), json!(limit.cost));
    out.insert("charge".to_owned(), charge(limit));
    let policy = match &limit.policy {
        LimitPolicy::Rate(policy) => policy,
        LimitPolicy::Concurrency(c) => {
            out.insert("algorithm".to_owned(), json!("concurrency"));
            out.insert("limit".to_owned(), json!(c.limit.get()));
            out.insert(
                "subject".to_owned(),
                subject(&limit.subject, check.subject, check.resolved, live, source),
            );
            return Value::Object(out);
        }
    };
    out.insert("algorithm".to_owned(), json!(policy.algorithm().name()));
    out.insert("shadow".to_owned(), json!(policy.shadow));
    out.insert("revision".to_owned(), json!(&*policy.revision));
    let quotas: Vec<Value> = policy
        .quotas()
        .iter()
        .map(|(quota, window)| json!({"quota": quota, "window_seconds": seconds(*window)}))
        .collect();
    out.insert("bands".to_owned(), Value::Array(quotas));
    out.insert(
        "subject".to_owned(),
        subject(&limit.subject, check.subject, check.resolved, live, source),
    );
    let Some((store, fallback, rated, outcome)) = peeked else {
        return Value::Object(out);
    };

    out.insert(
        "state".to_owned(),
        state(&outcome, policy, limit.cost, store),
    );
    let responses = check.responses();
    // This limit alone, by the proxy's own step.
    let (verdict, action) = match plan::decide(outcome, check.entry.route, policy, responses, live)
    {
        Step::Decided(verdict, action) => (verdict, action),
        Step::Local(failure) => {
            let share = live.store.local_share;
            let (outcome, shared) = fallback.peek(rated.evaluation, policy, share);
            plan::local_verdict(failure, outcome, policy, &shared, responses, &live.store)
        }
    };
    let response = match &action {
        Action::Respond(response) => Some(response),
        Action::Forward { .. } => None,
    };
    out.insert("answer".to_owned(), answer(response, &verdict, live).json());
    Value::Object(out)
}

/// When the limit is charged: `{"on": "request"}`, or on response with
/// the statuses that charge and where the units come from.
fn charge(limit: &crate::route::Limit) -> Value {
    let Some(on) = limit.on_response() else {
        return json!({"on": "request"});
    };
    let units = match &on.from_header {
        None => json!({"fixed": limit.cost}),
        Some(from) => json!({
            "from_response_header": from.header.as_str(),
            "max": from.max,
            "default": from.default,
            "reserve": from.reserve,
        }),
    };
    json!({
        "on": "response",
        "statuses": on.statuses.as_deref(),
        "checked_before_forwarding": limit.cost,
        "units": units,
    })
}

/// `response`: sluice's own answer; `None` for a request forwarded.
fn answer(
    response: Option<&http::Response<super::body::Body>>,
    verdict: &Verdict,
    live: &Live,
) -> Answer {
    Answer {
        status: response.map_or(StatusCode::OK, |r| r.status()),
        outcome: verdict.label(),
        forwarded: verdict.forwarded(),
        why: why(verdict, live),
        response: response.map(answered),
    }
}

fn subject(
    sources: &[SubjectSource],
    pseudonym: Pseudonym,
    resolved: Resolved,
    live: &Live,
    source: Source<'_>,
) -> Value {
    let sources: Vec<String> = sources.iter().map(ToString::to_string).collect();
    let kind = match resolved {
        Resolved::ClientIp => "client_ip",
        Resolved::Header => "header",
        Resolved::Global => "global",
        Resolved::Unresolved => "unresolved",
        Resolved::Undecodable => "undecodable",
        Resolved::Jwt => "jwt",
        Resolved::All => "all",
    };
    let mut out = json!({
        "sources": sources,
        "resolved": !matches!(resolved, Resolved::Unresolved | Resolved::Undecodable),
        "kind": kind,
        "pseudonym": pseudonym.to_string(),
    });
    if let Value::Object(map) = &mut out {
        if resolved == Resolved::Unresolved {
            map.insert(
                "note".to_owned(),
                json!("unresolved → shared bucket: every request of this route without a subject counts as one"),
            );
        }
        if resolved == Resolved::Undecodable {
            map.insert(
                "note".to_owned(),
                json!("undecodable Basic credential → shared bucket: every request of this route whose Basic credential decodes to nothing (or reads differently in different app servers) counts as one"),
            );
        }
        // A key drawn at random when a process starts is not this one:
        // the pseudonym would name nobody the sidecar counts.
        if matches!(source, Source::Offline) && live.identity.pseudonym_key.is_none() {
            map.insert("pseudonym".to_owned(), Value::Null);
            map.insert(
                "pseudonym_note".to_owned(),
                json!("identity.pseudonym_key is not set: each sidecar draws its own key at start"),
            );
        }
    }
    out
}

/// The state as it stands, from a peek's outcome. A peek evaluates the
/// route's cost without charging it: when admitted, what it reports left
/// is after that cost, so the cost is added back to say what is left now.
fn state(outcome: &Outcome, policy: &Policy, cost: u32, store: &Store) -> Value {
    let decided = |d: &Decision, allowed: bool| {
        let remaining = if allowed {
            d.remaining.saturating_add(u64::from(cost))
        } else {
            d.remaining
        };
        let (quota, window) = policy.quotas().get(d.band).copied().unwrap_or_default();
        json!({
            "store": store.kind(),
            "remaining": remaining,
            "band": d.band,
            "quota": quota,
            "window_seconds": seconds(window),
            "reset_seconds": seconds(d.reset_after),
            "retry_after_seconds": seconds(d.retry_after),
            "approximate": d.approximate,
        })
    };
    match outcome {
        Outcome::Allowed(d) => decided(d, true),
        Outcome::Denied(d) => decided(d, false),
        Outcome::Unavailable(reason) => json!({
            "store": "unavailable",
            "kind": store.kind(),
            "reason": unavailable(*reason),
        }),
        Outcome::Indeterminate => json!({
            "store": "unavailable",
            "kind": store.kind(),
            "reason": "the store was asked but no reply was confirmed",
        }),
        Outcome::Incompatible(reason) => json!({
            "store": "incompatible",
            "kind": store.kind(),
            "reason": format!("{reason:?}"),
        }),
    }
}

fn unavailable(reason: Unavailable) -> &'static str {
    match reason {
        Unavailable::AdmissionRejected => {
            "not asked: the breaker is open, the budget was spent, or the memory store has no room"
        }
        Unavailable::BeforeSend => "the store could not be reached",
        Unavailable::Refused => {
            "the store refused to run the evaluation (out of memory, busy, read-only, ...)"
        }
        Unavailable::ClockUnsafe => {
            "the store's clock went back past store.redis.max_clock_regression"
        }
    }
}

/// Why a request would get what it gets. No catch-all: a new verdict is
/// explained here before sluice builds.
fn why(verdict: &Verdict, live: &Live) -> String {
    let failure = |f: &Failure| match f {
        Failure::Unavailable(reason) => unavailable(*reason),
        Failure::Indeterminate => "the store gave no confirmed reply",
    };
    match verdict {
        Verdict::Unlimited => "no limit applies (policy: none): forwarded".to_owned(),
        Verdict::Allowed => "within the limit: forwarded to the upstream".to_owned(),
        Verdict::Denied => "over the limit: refused (`responses.refused`, sluice's own 429 unless written)".to_owned(),
        Verdict::ShadowDenied => {
            "over the limit, but the policy is shadow: forwarded, counted as shadow_denied"
                .to_owned()
        }
        Verdict::FailedClosed(f) => format!(
            "no decision ({}); on_failure is deny, or a local decision could not be made: answered as unavailable (`responses.unavailable`, sluice's own 503 unless written), Retry-After {}s",
            failure(f),
            live.store.failure_retry_after.as_secs()
        ),
        Verdict::FailedOpen(f) => format!(
            "no decision ({}); on_failure is allow: forwarded without a decision",
            failure(f)
        ),
        Verdict::LocalAllowed => format!(
            "the store cannot decide; on_failure is local: within this sidecar's share (each quota divided by store.local_share, {}): forwarded",
            live.store.local_share
        ),
        Verdict::LocalDenied => format!(
            "the store cannot decide; on_failure is local: over this sidecar's share (each quota divided by store.local_share, {}): refused",
            live.store.local_share
        ),
        Verdict::LocalShadowDenied => {
            "the store cannot decide; on_failure is local: over this sidecar's share, but the policy is shadow: forwarded"
                .to_owned()
        }
        Verdict::Incompatible(reason) => {
            format!("the store cannot evaluate this policy ({reason:?}): answered as unavailable")
        }
        Verdict::ConcurrencyDenied => {
            "every place of a concurrency limit is taken: refused (sluice's own 503 unless `responses.refused` says otherwise)".to_owned()
        }
        Verdict::ClientClosed => {
            "the client went away while the store was being asked: neither answered nor forwarded; the store may have charged it".to_owned()
        }
    }
}

/// A request the proxy refuses before any route or store.
fn refused(invalid: &Invalid) -> (Value, Value) {
    let status = service::refusal(invalid).status();
    let refused = json!({"label": invalid.label(), "reason": invalid.reason()});
    let answer = json!({
        "status": status.as_u16(),
        "outcome": "refused",
        "forwarded": false,
        "why": format!("refused before routing: {}", invalid.reason()),
    });
    (refused, answer)
}

/// `OPTIONS *` that sluice answers itself, on either protocol.
fn answered_by_sluice() -> Value {
    json!({
        "status": 200,
        "outcome": "answered",
        "forwarded": false,
        "allow": respond::SERVER_ALLOW,
        "why": "OPTIONS * asks about the server, not a resource, and no route has path \"*\": sluice answers it (200, Allow), nothing is charged or forwarded",
    })
}

/// Seconds, to the millisecond.
fn seconds(d: Duration) -> f64 {
    (d.as_millis() as f64) / 1000.0
}
