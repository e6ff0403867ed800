//! The integration tests, in one binary: real `redis-server` processes,
//! a real upstream, and the built `sluice` binary. One module a concern;
//! `support` is what they share.

// Tests time real processes and lock their own fixtures plainly: the lint
// policy's clock and lock rules are for sluice's own code.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

mod address_claims;
mod address_rules;
mod app_spellings;
mod broken_upstream;
mod clocks_and_cardinality;
mod cluster_hang_ups;
mod coalesced_decisions;
mod combined_subjects;
mod config_check;
mod connection_shares;
mod custom_refusals;
mod delay;
mod e2e_limits;
mod explain;
mod hang_ups;
mod head_budget;
mod hostile_requests;
mod identity;
mod ingress_import;
mod jwt_claims;
mod leases;
mod local_fallback;
mod manifests_check;
mod memory_bound;
mod operations;
mod operator_metrics;
mod proxy_protocol;
mod proxy_smoke;
mod proxying;
mod quickstart;
mod redis_e2e;
mod redis_eviction;
mod redis_failures;
mod redis_records;
mod redis_scripts;
mod redis_several;
mod redis_store;
mod redis_topologies;
mod request_buffering;
mod request_corpus;
mod reservations;
mod response_limits;
mod route_conditions;
mod several_limits;
mod slow_clients;
mod store_breaker;
mod store_faults;
mod tier_trust;
mod upload_floor;
mod upstream_keepalive;
mod what_the_app_sees;
