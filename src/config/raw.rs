//! The YAML as written: a serde mirror of each section, unknown keys refused.
//!
//! Leaves are kept as [`Scalar`] text, so serde only checks the shape (known
//! keys, mapping vs list vs scalar) and `validate` reports every bad value,
//! not just the first one per section. It also lets a number arrive through
//! `${NAME}` substitution, which always yields text.

use std::fmt;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// A scalar leaf as text (`10`, `true`, `10s`, `/login`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scalar(pub String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor).map(Scalar)
    }
}

struct ScalarVisitor;

impl Visitor<'_> for ScalarVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a single value (text, number or true/false)")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
}

/// `subject`: one source, a list of them tried in order, or a
/// combination; a list may hold combinations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subjects {
    One(SubjectItem),
    Many(Vec<SubjectItem>),
}

/// One source (`client_ip`, `header:X-API-Key`) or `{ all: [...] }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectItem {
    Source(Scalar),
    All(Option<ScalarList>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "`{ all: [...] }`")]
struct AllOf {
    all: Option<ScalarList>,
}

impl<'de> Deserialize<'de> for Subjects {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SubjectsVisitor)
    }
}

impl<'de> Deserialize<'de> for SubjectItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match d.deserialize_any(SubjectsVisitor)? {
            Subjects::One(item) => Ok(item),
            Subjects::Many(_) => Err(de::Error::custom(
                "a list inside a list of subjects; write `{ all: [...] }` for a combination",
            )),
        }
    }
}

struct SubjectsVisitor;

impl<'de> Visitor<'de> for SubjectsVisitor {
    type Value = Subjects;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a subject, a list of subjects, or `{ all: [...] }`")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Subjects, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<SubjectItem>()? {
            items.push(item);
        }
        Ok(Subjects::Many(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Subjects, A::Error> {
        let all = AllOf::deserialize(MapAccessDeserializer::new(map))?;
        Ok(Subjects::One(SubjectItem::All(all.all)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Subjects, E> {
        Ok(Subjects::One(SubjectItem::Source(Scalar(v.to_owned()))))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Subjects, E> {
        Ok(Subjects::One(SubjectItem::Source(Scalar(v))))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Subjects, E> {
        ScalarVisitor
            .visit_bool(v)
            .map(|s| Subjects::One(SubjectItem::Source(Scalar(s))))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Subjects, E> {
        ScalarVisitor
            .visit_i64(v)
            .map(|s| Subjects::One(SubjectItem::Source(Scalar(s))))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Subjects, E> {
        ScalarVisitor
            .visit_u64(v)
            .map(|s| Subjects::One(SubjectItem::Source(Scalar(s))))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Subjects, E> {
        ScalarVisitor
            .visit_f64(v)
            .map(|s| Subjects::One(SubjectItem::Source(Scalar(s))))
    }
}

/// One value or a list of them (`methods: GET` or `methods: [GET, POST]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScalarList {
    One(Scalar),
    Many(Vec<Scalar>),
}

impl<'de> Deserialize<'de> for ScalarList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarListVisitor)
    }
}

struct ScalarListVisitor;

impl<'de> Visitor<'de> for ScalarListVisitor {
    type Value = ScalarList;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value or a list of values")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ScalarList, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Scalar>()? {
            items.push(item);
        }
        Ok(ScalarList::Many(items))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ScalarList, E> {
        ScalarVisitor
            .visit_str(v)
            .map(|s| ScalarList::One(Scalar(s)))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<ScalarList, E> {
        Ok(ScalarList::One(Scalar(v)))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<ScalarList, E> {
        ScalarVisitor
            .visit_bool(v)
            .map(|s| ScalarList::One(Scalar(s)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ScalarList, E> {
        ScalarVisitor
            .visit_i64(v)
            .map(|s| ScalarList::One(Scalar(s)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ScalarList, E> {
        ScalarVisitor
            .visit_u64(v)
            .map(|s| ScalarList::One(Scalar(s)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<ScalarList, E> {
        ScalarVisitor
            .visit_f64(v)
            .map(|s| ScalarList::One(Scalar(s)))
    }
}

/// The top-level keys, in the order `validate` reads them.
pub const SECTIONS: [&str; 9] = [
    "version",
    "server",
    "upstream",
    "store",
    "identity",
    "responses",
    "policies",
    "routes",
    "default",
];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Server {
    pub listen: Option<Scalar>,
    pub admin: Option<Scalar>,
    pub tls: Option<Tls>,
    pub shutdown_delay: Option<Scalar>,
    pub shutdown_grace: Option<Scalar>,
    pub header_read_timeout: Option<Scalar>,
    pub body_idle_timeout: Option<Scalar>,
    pub min_upload_rate: Option<MinUploadRate>,
    pub max_header_bytes: Option<Scalar>,
    pub workers: Option<Scalar>,
    pub paths: Option<Paths>,
    pub headers_with_underscores: Option<Scalar>,
    pub explain: Option<Explain>,
    pub idle_timeout: Option<Scalar>,
    pub send_timeout: Option<Scalar>,
    pub max_connections: Option<Scalar>,
    pub max_connections_per_ip: Option<Scalar>,
    pub http2: Option<Http2>,
    pub request_heads: Option<RequestHeads>,
    pub request_buffering: Option<RequestBuffering>,
    pub proxy_protocol: Option<ScalarList>,
}

/// `server.min_upload_rate`: one value (`off`, or a rate) or the mapping.
pub type MinUploadRate = OneOr<MinUploadRateTable>;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct MinUploadRateTable {
    pub bytes_per_second: Option<Scalar>,
    pub grace: Option<Scalar>,
}

/// A key written either as one value or as a mapping of its terms.
#[derive(Debug)]
pub enum OneOr<T> {
    One(Scalar),
    Table(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OneOrVisitor(std::marker::PhantomData))
    }
}

struct OneOrVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrVisitor<T> {
    type Value = OneOr<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a single value or a mapping")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<OneOr<T>, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(OneOr::Table)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOr<T>, E> {
        ScalarVisitor.visit_str(v).map(|s| OneOr::One(Scalar(s)))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<OneOr<T>, E> {
        Ok(OneOr::One(Scalar(v)))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<OneOr<T>, E> {
        ScalarVisitor.visit_bool(v).map(|s| OneOr::One(Scalar(s)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<OneOr<T>, E> {
        ScalarVisitor.visit_i64(v).map(|s| OneOr::One(Scalar(s)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<OneOr<T>, E> {
        ScalarVisitor.visit_u64(v).map(|s| OneOr::One(Scalar(s)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<OneOr<T>, E> {
        ScalarVisitor.visit_f64(v).map(|s| OneOr::One(Scalar(s)))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Explain {
    pub token: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct RequestHeads {
    pub per_connection: Option<Scalar>,
    pub per_client: Option<Scalar>,
    pub total: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct RequestBuffering {
    pub max_body: Option<Scalar>,
    pub total: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Http2 {
    pub max_concurrent_streams: Option<Scalar>,
    pub max_pending_accept_reset_streams: Option<Scalar>,
    pub max_local_error_reset_streams: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Paths {
    pub merge_slashes: Option<Scalar>,
    pub escaped_slashes: Option<Scalar>,
    pub path_parameters: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Tls {
    pub cert: Option<Scalar>,
    pub key: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Upstream {
    pub url: Option<Scalar>,
    pub connect_timeout: Option<Scalar>,
    pub timeout: Option<Scalar>,
}

/// Both kinds' keys, so a key of the other kind is reported by name rather
/// than as unknown.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Store {
    pub kind: Option<Scalar>,
    pub budget: Option<Scalar>,
    pub on_failure: Option<Scalar>,
    pub local_share: Option<Scalar>,
    pub failure_retry_after: Option<Scalar>,
    pub ttl_grace: Option<Scalar>,
    // memory
    pub max_entries: Option<Scalar>,
    // redis
    pub url: Option<Scalar>,
    pub pool_size: Option<Scalar>,
    pub ca_file: Option<Scalar>,
    pub key_prefix: Option<Scalar>,
    pub scripts: Option<Scalar>,
    pub coalesce: Option<Scalar>,
    pub max_clock_regression: Option<Scalar>,
    pub dedupe_window: Option<Scalar>,
    pub dedupe_max: Option<Scalar>,
    pub breaker_failures: Option<Scalar>,
    pub breaker_window: Option<Scalar>,
    pub breaker_min_calls: Option<Scalar>,
    pub breaker_failure_rate: Option<Scalar>,
    pub breaker_cooldown: Option<Scalar>,
    pub deny_cache_entries: Option<Scalar>,
    pub topology: Option<Scalar>,
    pub nodes: Option<ScalarList>,
    pub sentinel: Option<Sentinel>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Sentinel {
    pub master: Option<Scalar>,
    pub nodes: Option<ScalarList>,
    pub username: Option<Scalar>,
    pub password: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Identity {
    pub trusted_proxies: Option<ScalarList>,
    pub ipv6_prefix: Option<Scalar>,
    pub pseudonym_key: Option<Scalar>,
    pub pseudonym_key_version: Option<Scalar>,
    pub jwt: Option<Jwt>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Jwt {
    pub keys_file: Option<Scalar>,
    pub secret: Option<Scalar>,
    pub issuer: Option<Scalar>,
    pub audiences: Option<ScalarList>,
    pub leeway: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Responses {
    pub ratelimit_headers_on_allowed: Option<Scalar>,
    pub refused: Option<Answer>,
    pub unavailable: Option<Answer>,
}

/// A route's own `responses:`: the answers only.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct RouteResponses {
    pub refused: Option<Answer>,
    pub unavailable: Option<Answer>,
}

/// `refused` / `unavailable`: `{ status, content_type, body_file, headers }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Answer {
    pub status: Option<Scalar>,
    pub content_type: Option<Scalar>,
    pub body_file: Option<Scalar>,
    pub headers: Option<serde_yaml::Mapping>,
}

/// The parameters of one band, of any algorithm; `validate` refuses those
/// that do not belong to the policy's algorithm.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Params {
    pub limit: Option<Scalar>,
    pub window: Option<Scalar>,
    pub capacity: Option<Scalar>,
    pub refill_tokens: Option<Scalar>,
    pub refill_every: Option<Scalar>,
    pub burst: Option<Scalar>,
}

impl Params {
    /// Every parameter written, by name, in a fixed order.
    pub fn written(&self) -> Vec<(&'static str, &Scalar)> {
        [
            ("limit", &self.limit),
            ("window", &self.window),
            ("capacity", &self.capacity),
            ("refill_tokens", &self.refill_tokens),
            ("refill_every", &self.refill_every),
            ("burst", &self.burst),
        ]
        .into_iter()
        .filter_map(|(name, v)| v.as_ref().map(|v| (name, v)))
        .collect()
    }
}

/// serde cannot combine `flatten` with `deny_unknown_fields`, so the flat
/// parameters are repeated here and gathered by [`Policy::flat`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Policy {
    pub algorithm: Option<Scalar>,
    pub limit: Option<Scalar>,
    pub window: Option<Scalar>,
    pub capacity: Option<Scalar>,
    pub refill_tokens: Option<Scalar>,
    pub refill_every: Option<Scalar>,
    pub burst: Option<Scalar>,
    pub bands: Option<Vec<Params>>,
    pub shadow: Option<Scalar>,
    pub revision: Option<Scalar>,
    /// `concurrency` only.
    pub retry_after: Option<Scalar>,
    pub on_failure: Option<Scalar>,
    /// `off`, `on`, or [`Lease`]: read by the policy's validation.
    pub lease: Option<serde_yaml::Value>,
    pub near_limit: Option<Scalar>,
    /// `on` / `off`: the rate-limit fields of the policy's answers.
    pub headers: Option<Scalar>,
    pub delay: Option<Delay>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Delay {
    pub max_wait: Option<Scalar>,
    pub max_queued: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping, `on` or `off`")]
pub struct Lease {
    pub ttl: Option<Scalar>,
    pub max_share: Option<Scalar>,
}

impl Policy {
    pub fn flat(&self) -> Params {
        Params {
            limit: self.limit.clone(),
            window: self.window.clone(),
            capacity: self.capacity.clone(),
            refill_tokens: self.refill_tokens.clone(),
            refill_every: self.refill_every.clone(),
            burst: self.burst.clone(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Route {
    pub name: Option<Scalar>,
    #[serde(rename = "match")]
    pub matcher: Option<Match>,
    pub subject: Option<Subjects>,
    pub policy: Option<Scalar>,
    pub tiers: Option<Tiers>,
    pub cost: Option<Cost>,
    pub charge: Option<Charge>,
    pub limits: Option<Vec<Limit>>,
    pub upgrades: Option<ScalarList>,
    pub responses: Option<RouteResponses>,
    pub exempt: Option<ScalarList>,
    pub deny: Option<ScalarList>,
}

/// One entry of a route's `limits:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Limit {
    pub policy: Option<Scalar>,
    pub tiers: Option<Tiers>,
    pub subject: Option<Subjects>,
    pub cost: Option<Cost>,
    pub charge: Option<Charge>,
    pub exempt: Option<ScalarList>,
}

/// `cost`: a number, or `{ from_response_header, max, default, reserve }`.
pub type Cost = OneOr<ResponseCost>;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct ResponseCost {
    pub from_response_header: Option<Scalar>,
    pub max: Option<Scalar>,
    pub default: Option<Scalar>,
    pub reserve: Option<Scalar>,
}

/// `charge: { on: request | response, statuses: [...] }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Charge {
    pub on: Option<Scalar>,
    pub statuses: Option<ScalarList>,
}

/// `tiers: { header, policies: { VALUE: POLICY }, default }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Tiers {
    pub header: Option<Scalar>,
    pub claim: Option<Scalar>,
    pub policies: Option<serde_yaml::Mapping>,
    pub default: Option<Scalar>,
    pub trusted_from: Option<ScalarList>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct Match {
    pub methods: Option<ScalarList>,
    pub path: Option<Scalar>,
    pub path_prefix: Option<Scalar>,
    pub case_sensitive: Option<Scalar>,
    pub format_suffix: Option<Scalar>,
    pub hosts: Option<ScalarList>,
    pub headers: Option<serde_yaml::Mapping>,
    pub query: Option<serde_yaml::Mapping>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub struct DefaultRoute {
    pub policy: Option<Scalar>,
    pub tiers: Option<Tiers>,
    pub subject: Option<Subjects>,
    pub limits: Option<Vec<Limit>>,
    pub upgrades: Option<ScalarList>,
    pub responses: Option<RouteResponses>,
    pub exempt: Option<ScalarList>,
    pub deny: Option<ScalarList>,
}
