//! Every setting of the sections (`server`, `upstream`, `store`,
//! `identity`, `responses`): its name, type, default, when a change takes
//! effect and what it means, in one table. Validation takes each default
//! from here (parsed by the key's own parser, so a default that would not
//! load fails every test); `sluice keys` prints the table; the reference
//! in `docs/CONFIGURATION.md` is generated from it, and tests hold the
//! chart's `values.yaml` and the boot part's restart-only keys to it.
//!
//! [`ENTRIES`] does the same for the keys of one policy, one route and
//! `default` (`policies.NAME.shadow`, `routes[].cost`): maps and lists of
//! the user's own names, every one of them applied on reload.

use std::fmt::Write as _;

/// When a changed value takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// On the next reload of the file.
    Reload,
    /// Only when sluice starts: a reload that changes it keeps the value
    /// the process started with, applies the rest of the file, and warns
    /// naming the key (`reload`).
    Restart,
}

/// What an unwritten key means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absent {
    /// This value, as it would be written in the file.
    Value(&'static str),
    /// Worked out from other settings, as described.
    Derived(&'static str),
    /// The key must be written (where the section applies).
    Required,
    /// Off, or not set: described.
    Unset(&'static str),
}

/// One key of a section, or of one entry of `policies` or `routes`.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// Dotted, from the top of the file: `server.shutdown_delay`; in an
    /// entry, `NAME` stands for a policy's name and `[]` for any index:
    /// `policies.NAME.shadow`, `routes[].limits[].cost`.
    pub path: &'static str,
    pub kind: &'static str,
    pub default: Absent,
    pub applied: Applied,
    pub meaning: &'static str,
}

impl Key {
    /// The name within its section.
    pub fn name(&self) -> &'static str {
        self.path.rsplit('.').next().unwrap_or(self.path)
    }

    /// Whether `at` (`routes[2].cost`) is this key's place.
    pub fn is_at(&self, at: &str) -> bool {
        // A policy's name may hold dots of its own: `NAME` is whatever
        // stands between the parts around it (a name refused as invalid,
        // even empty, is still checked in place).
        if let Some((before, after)) = self.path.split_once(".NAME.") {
            let after = format!(".{after}");
            return at
                .strip_prefix(before)
                .and_then(|rest| rest.strip_prefix('.'))
                .and_then(|rest| rest.strip_suffix(after.as_str()))
                .is_some();
        }
        let mut ours = self.path.split('.');
        let mut theirs = at.split('.');
        loop {
            match (ours.next(), theirs.next()) {
                (None, None) => return true,
                (Some(a), Some(b)) if a == "NAME" || a == b => {}
                (Some(a), Some(b)) => match (a.strip_suffix("[]"), b.split_once('[')) {
                    (Some(list), Some((name, index))) if list == name && index.ends_with(']') => {}
                    _ => return false,
                },
                _ => return false,
            }
        }
    }

    /// The literal default, for a key that has one.
    pub fn value(&self) -> &'static str {
        match self.default {
            Absent::Value(value) => value,
            // A key without a literal default is not read through
            // `Checker::defaulted`; the table test checks which are.
            Absent::Derived(_) | Absent::Required | Absent::Unset(_) => "",
        }
    }
}

macro_rules! keys {
    ($list:ident: $($name:ident: $path:literal, $kind:literal, $default:expr, $applied:ident, $meaning:literal;)*) => {
        $(pub const $name: Key = Key {
            path: $path,
            kind: $kind,
            default: $default,
            applied: Applied::$applied,
            meaning: $meaning,
        };)*
        /// Every key, in the order of the reference.
        pub const $list: &[Key] = &[$($name),*];
    };
}

use Absent::{Derived, Required, Unset, Value};

keys! { ALL:
    SERVER_LISTEN: "server.listen", "address", Required, Restart,
        "where traffic comes in, `IP:PORT`";
    SERVER_ADMIN: "server.admin", "address", Unset("no admin listener"), Restart,
        "the admin listener: `/metrics`, `/healthz`, `/readyz`";
    SERVER_TLS: "server.tls", "mapping", Unset("plain HTTP"), Restart,
        "serve TLS on `listen`: `{ cert: FILE, key: FILE }`, PEM";
    SERVER_SHUTDOWN_DELAY: "server.shutdown_delay", "duration", Value("5s"), Restart,
        "after SIGTERM, how long sluice keeps serving with `/readyz` 503 before it drains";
    SERVER_SHUTDOWN_GRACE: "server.shutdown_grace", "duration", Value("20s"), Restart,
        "then, how long in-flight requests may take to finish";
    SERVER_HEADER_READ_TIMEOUT: "server.header_read_timeout", "duration", Value("10s"), Restart,
        "time allowed to read a request's headers (the slowloris bound); > 0";
    SERVER_BODY_IDLE_TIMEOUT: "server.body_idle_timeout", "duration", Value("30s"), Reload,
        "longest silence between two pieces of a request body, then 408; > 0";
    SERVER_MIN_UPLOAD_RATE: "server.min_upload_rate", "mapping, number or `off`", Value("{ bytes_per_second: 240, grace: 5s }"), Reload,
        "the slowest a request body may arrive, once `grace` has passed, then 408";
    SERVER_MAX_HEADER_BYTES: "server.max_header_bytes", "number", Value("32768"), Restart,
        "largest request head accepted (HTTP/1 head, HTTP/2 header list); 8192 to 16777216";
    SERVER_WORKERS: "server.workers", "number", Value("0"), Restart,
        "worker threads; `0` is one per core; at most 1024";
    SERVER_IDLE_TIMEOUT: "server.idle_timeout", "duration", Value("60s"), Restart,
        "a connection with no request in flight this long is closed gracefully; > 0";
    SERVER_SEND_TIMEOUT: "server.send_timeout", "duration", Value("60s"), Restart,
        "a write to a client blocked this long closes the connection (HTTP/2: resets the stream); > 0";
    SERVER_MAX_CONNECTIONS: "server.max_connections", "number", Value("10000"), Restart,
        "traffic connections open at once; 1 to 1000000";
    SERVER_MAX_CONNECTIONS_PER_IP: "server.max_connections_per_ip", "number", Derived("256, at most an eighth of `max_connections`"), Restart,
        "of those, at most this many from one client address (IPv6: one /64; a /56 four times as many); trusted proxies are not counted, the clients their PROXY protocol headers name are";
    SERVER_PROXY_PROTOCOL: "server.proxy_protocol", "`v1`, `v2` or a list", Value("[]"), Restart,
        "read a PROXY protocol header from peers in `identity.trusted_proxies`";
    SERVER_REQUEST_HEADS_PER_CONNECTION: "server.request_heads.per_connection", "number", Value("2097152"), Restart,
        "bytes of request heads one connection may hold at once (HTTP/1: a head still arriving; HTTP/2: its open streams' header lists, 16 KiB more a stream); at least `max_header_bytes`";
    SERVER_REQUEST_HEADS_PER_CLIENT: "server.request_heads.per_client", "number", Derived("a quarter of `total`, at least `per_connection`"), Restart,
        "the same for all the connections of one client address (IPv6: one /64); at least `per_connection`";
    SERVER_REQUEST_HEADS_TOTAL: "server.request_heads.total", "number", Value("16777216"), Restart,
        "the same for every connection at once; at least `per_client`; see the memory formula in docs/OPERATIONS.md";
    SERVER_REQUEST_BUFFERING_MAX_BODY: "server.request_buffering.max_body", "number", Value("65536"), Reload,
        "a request that matched a concurrency limit, with a body of at most this many bytes, is received whole before it takes its place; larger bodies stream, at most a quarter of the limit's places at once; `0`: off, every body streams";
    SERVER_REQUEST_BUFFERING_TOTAL: "server.request_buffering.total", "number", Value("4194304"), Reload,
        "bytes of request bodies so received held at once; past it a body streams instead; at least `max_body`; see the memory formula in docs/OPERATIONS.md";
    SERVER_HTTP2_MAX_CONCURRENT_STREAMS: "server.http2.max_concurrent_streams", "number", Value("128"), Restart,
        "streams a client may have open on one HTTP/2 connection";
    SERVER_HTTP2_MAX_PENDING_ACCEPT_RESET_STREAMS: "server.http2.max_pending_accept_reset_streams", "number", Value("20"), Restart,
        "streams a client reset before they were accepted (the rapid-reset bound)";
    SERVER_HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS: "server.http2.max_local_error_reset_streams", "number", Value("1024"), Restart,
        "streams reset for the client's protocol errors before the connection is closed";
    SERVER_PATHS_MERGE_SLASHES: "server.paths.merge_slashes", "`true`, `false`", Value("true"), Reload,
        "`//` becomes `/` before matching and forwarding";
    SERVER_PATHS_ESCAPED_SLASHES: "server.paths.escaped_slashes", "`reject`, `keep`, `decode`", Value("reject"), Reload,
        "`%2F` and `%5C` in a path: 400, kept encoded, or decoded to `/`";
    SERVER_PATHS_PATH_PARAMETERS: "server.paths.path_parameters", "`ignore`, `strip`, `reject`", Value("ignore"), Reload,
        "`;params` in a segment: left out of matching, left out of both, or 400";
    SERVER_EXPLAIN: "server.explain", "mapping", Unset("`POST /explain` off"), Reload,
        "`{ token: TEXT }` turns `POST /explain` on for `Authorization: Bearer TEXT`";
    SERVER_HEADERS_WITH_UNDERSCORES: "server.headers_with_underscores", "`drop`, `reject`, `allow`", Value("drop"), Reload,
        "request headers whose names contain `_`: removed, refused or passed on";
    UPSTREAM_URL: "upstream.url", "URL", Required, Reload,
        "the application: `http://host[:port][/base]`";
    UPSTREAM_CONNECT_TIMEOUT: "upstream.connect_timeout", "duration", Value("1s"), Restart,
        "connecting to the application; beyond it, 502; > 0";
    UPSTREAM_TIMEOUT: "upstream.timeout", "duration", Value("60s"), Reload,
        "how long the application may keep a request waiting on its own turn; beyond it, 504; > 0";
    STORE_KIND: "store.kind", "`memory`, `redis`", Value("memory"), Restart,
        "`memory`: in this process; `redis`: shared by every replica";
    STORE_BUDGET: "store.budget", "duration", Value("25ms"), Reload,
        "the whole decision, connecting and retries included; > 0";
    STORE_ON_FAILURE: "store.on_failure", "`deny`, `allow`, `local`", Value("deny"), Reload,
        "no decision in time: 503, forward, or decide in this sidecar (`local`, Redis only)";
    STORE_LOCAL_SHARE: "store.local_share", "number", Value("1"), Reload,
        "under `on_failure: local`, each quota is divided by this while the store cannot decide";
    STORE_FAILURE_RETRY_AFTER: "store.failure_retry_after", "duration", Value("1s"), Reload,
        "`Retry-After` of the 503s answered for no decision; > 0";
    STORE_TTL_GRACE: "store.ttl_grace", "duration", Value("5s"), Restart,
        "added to each key's lifetime before it expires";
    STORE_MAX_ENTRIES: "store.max_entries", "number", Derived("from the memory limit"), Restart,
        "memory store: most subjects tracked at once; beyond it the cheapest to forget is evicted";
    STORE_TOPOLOGY: "store.topology", "`standalone`, `cluster`, `sentinel`", Value("standalone"), Restart,
        "Redis: how the primary is found";
    STORE_URL: "store.url", "URL", Required, Restart,
        "Redis standalone: `redis://[user:password@]host:port[/db]` or `rediss://`";
    STORE_NODES: "store.nodes", "list of URLs", Required, Restart,
        "Redis Cluster: seed nodes; one is enough";
    STORE_SENTINEL: "store.sentinel", "mapping", Required, Restart,
        "Redis Sentinel: `master`, `nodes`, and the primary's `username`, `password`";
    STORE_POOL_SIZE: "store.pool_size", "number", Value("16"), Restart,
        "Redis: most connections per sluice, multiplexed; 1 to 1024";
    STORE_CA_FILE: "store.ca_file", "path", Unset("the system's roots"), Restart,
        "Redis: PEM roots for `rediss://` servers with a private CA";
    STORE_KEY_PREFIX: "store.key_prefix", "text", Value("sluice"), Restart,
        "Redis: prefix of every key";
    STORE_SCRIPTS: "store.scripts", "`auto`, `functions`, `eval`", Value("auto"), Restart,
        "Redis: run the scripts as Functions (`FCALL`) or cached scripts (`EVALSHA`); `auto` finds which the store has at start";
    STORE_COALESCE: "store.coalesce", "`on`, `off`", Value("off"), Restart,
        "Redis Functions: decisions that arrive while calls are in flight go together in the next, one call deciding each in order (measured: Redis's CPU per decision moves little, a sidecar at 8-32 connections decides fewer)";
    STORE_MAX_CLOCK_REGRESSION: "store.max_clock_regression", "duration", Value("1s"), Restart,
        "Redis: a clock going back by less counts as no time passing; beyond, no decision";
    STORE_DEDUPE_WINDOW: "store.dedupe_window", "duration", Derived("`1s`, or `budget` when longer"), Restart,
        "Redis: how long each admitted evaluation's record lives, so a retry is not charged twice";
    STORE_DEDUPE_MAX: "store.dedupe_max", "number", Value("256"), Restart,
        "no longer used; accepted so older files load";
    STORE_BREAKER_FAILURES: "store.breaker_failures", "number", Value("5"), Restart,
        "Redis: failures within `breaker_window` below which the breaker never opens";
    STORE_BREAKER_WINDOW: "store.breaker_window", "duration", Value("10s"), Restart,
        "Redis: how far back the breaker counts calls and failures; > 0";
    STORE_BREAKER_MIN_CALLS: "store.breaker_min_calls", "number", Value("10"), Restart,
        "Redis: calls within the window below which the breaker never opens";
    STORE_BREAKER_FAILURE_RATE: "store.breaker_failure_rate", "percentage", Value("50%"), Restart,
        "Redis: the share of failed calls from which the breaker opens";
    STORE_BREAKER_COOLDOWN: "store.breaker_cooldown", "duration", Value("1s"), Restart,
        "Redis: how long an open breaker answers at once before one probe; > 0";
    STORE_DENY_CACHE_ENTRIES: "store.deny_cache_entries", "number", Value("100000"), Restart,
        "Redis: subjects remembered as denied until a known instant, answered 429 without a call";
    IDENTITY_TRUSTED_PROXIES: "identity.trusted_proxies", "list of CIDRs or addresses", Value("[]"), Reload,
        "peers allowed to speak through `X-Forwarded-For` and to send a PROXY header";
    IDENTITY_IPV6_PREFIX: "identity.ipv6_prefix", "number", Value("64"), Reload,
        "IPv6 clients are counted per prefix of this length; 1 to 128";
    IDENTITY_PSEUDONYM_KEY: "identity.pseudonym_key", "text", Unset("drawn at random at start (memory only; required with Redis)"), Reload,
        "HMAC key that turns subjects into pseudonyms; at least 16 bytes";
    IDENTITY_PSEUDONYM_KEY_VERSION: "identity.pseudonym_key_version", "number", Value("1"), Reload,
        "bump it with the key: old and new pseudonyms never mix";
    IDENTITY_JWT: "identity.jwt", "mapping", Unset("no `jwt:` subjects or claim tiers"), Reload,
        "verified bearer tokens: `{ keys_file | secret, issuer, audiences, leeway }`";
    IDENTITY_JWT_KEYS_FILE: "identity.jwt.keys_file", "path", Unset("`secret` instead"), Reload,
        "a JWKS, a JWK or PEM public keys (RS256, PS256, ES256, ES384, EdDSA); read again when it changes";
    IDENTITY_JWT_SECRET: "identity.jwt.secret", "text", Unset("`keys_file` instead"), Reload,
        "an HS256 shared secret, at least 32 bytes (write `${VAR}`)";
    IDENTITY_JWT_ISSUER: "identity.jwt.issuer", "text", Unset("any issuer"), Reload,
        "the `iss` a token must carry";
    IDENTITY_JWT_AUDIENCES: "identity.jwt.audiences", "list of text", Unset("any audience"), Reload,
        "a token's `aud` must name one of these";
    IDENTITY_JWT_LEEWAY: "identity.jwt.leeway", "duration", Value("30s"), Reload,
        "clock skew allowed on `exp` and `nbf`, in whole seconds";
    RESPONSES_RATELIMIT_HEADERS_ON_ALLOWED: "responses.ratelimit_headers_on_allowed", "`true`, `false`", Value("true"), Reload,
        "also send `RateLimit` fields on forwarded responses; 429 and 503 always carry them (unless the policy says `headers: off`)";
    RESPONSES_REFUSED: "responses.refused", "mapping", Unset("sluice's problem+json"), Reload,
        "the answer when a limit refuses a request: `{ status, content_type, body_file, headers }`";
    RESPONSES_REFUSED_STATUS: "responses.refused.status", "status", Derived("429 (a concurrency limit: 503)"), Reload,
        "400 to 499, or 200";
    RESPONSES_REFUSED_CONTENT_TYPE: "responses.refused.content_type", "text", Unset("written with `body_file`, which needs it"), Reload,
        "the `Content-Type` of `body_file`";
    RESPONSES_REFUSED_BODY_FILE: "responses.refused.body_file", "path", Unset("sluice's problem+json body"), Reload,
        "the body, sent as it is; read when the configuration loads or reloads; at most 64 KiB";
    RESPONSES_REFUSED_HEADERS: "responses.refused.headers", "mapping", Unset("no fields added"), Reload,
        "fields added to the answer; not framing or hop-by-hop fields, `Content-Type`, `RateLimit*` or `Retry-After`";
    RESPONSES_UNAVAILABLE: "responses.unavailable", "mapping", Unset("sluice's problem+json"), Reload,
        "the answer when a limit cannot be checked and `on_failure` is `deny`: `{ status, content_type, body_file, headers }`";
    RESPONSES_UNAVAILABLE_STATUS: "responses.unavailable.status", "status", Derived("503"), Reload,
        "500 to 599, or 429";
    RESPONSES_UNAVAILABLE_CONTENT_TYPE: "responses.unavailable.content_type", "text", Unset("written with `body_file`, which needs it"), Reload,
        "the `Content-Type` of `body_file`";
    RESPONSES_UNAVAILABLE_BODY_FILE: "responses.unavailable.body_file", "path", Unset("sluice's problem+json body"), Reload,
        "the body, as for `refused`";
    RESPONSES_UNAVAILABLE_HEADERS: "responses.unavailable.headers", "mapping", Unset("no fields added"), Reload,
        "fields added to the answer, as for `refused`";
}

keys! { ENTRIES:
    POLICY_ALGORITHM: "policies.NAME.algorithm", "text", Required, Reload,
        "`fixed-window`, `sliding-counter`, `sliding-log`, `token-bucket`, `gcra` or `concurrency`";
    POLICY_LIMIT: "policies.NAME.limit", "number", Required, Reload,
        "units per `window` (concurrency: requests in flight); not for token-bucket";
    POLICY_WINDOW: "policies.NAME.window", "duration", Required, Reload,
        "the window of `limit`: fixed-window, sliding-counter, sliding-log, gcra";
    POLICY_CAPACITY: "policies.NAME.capacity", "number", Required, Reload,
        "token-bucket: tokens a full bucket holds";
    POLICY_REFILL_TOKENS: "policies.NAME.refill_tokens", "number", Value("1"), Reload,
        "token-bucket: tokens added every `refill_every`";
    POLICY_REFILL_EVERY: "policies.NAME.refill_every", "duration", Required, Reload,
        "token-bucket: how often `refill_tokens` are added";
    POLICY_BURST: "policies.NAME.burst", "number", Derived("`limit`"), Reload,
        "gcra: most units admitted at once";
    POLICY_BANDS: "policies.NAME.bands", "list", Unset("one band, its parameters written in the policy"), Reload,
        "several bands of the policy's algorithm, each with its own parameters; all must pass";
    POLICY_SHADOW: "policies.NAME.shadow", "`true`, `false`", Value("false"), Reload,
        "decide and count, but forward what the policy would refuse";
    POLICY_REVISION: "policies.NAME.revision", "text", Derived("from the parameters whose change alters what a count means"), Reload,
        "counts are kept while it stays the same; a new one starts them afresh";
    POLICY_ON_FAILURE: "policies.NAME.on_failure", "text", Derived("`store.on_failure`"), Reload,
        "this policy's answer when the store cannot decide";
    POLICY_LEASE: "policies.NAME.lease", "`auto`, `on`, `off`, or a mapping", Value("auto"), Reload,
        "Redis: hot subjects spend blocks of quota taken at once (token-bucket, gcra; fixed-window or sliding-counter of one band); `auto` leases every policy that can be, with the defaults below, and is silent where one cannot (other algorithms, `shadow`, `delay`, the memory store)";
    POLICY_LEASE_TTL: "policies.NAME.lease.ttl", "duration", Value("250ms"), Reload,
        "the longest a lease is held before what is left of it goes back; at most half `store.dedupe_window`";
    POLICY_LEASE_MAX_SHARE: "policies.NAME.lease.max_share", "percentage", Value("10%"), Reload,
        "the most of what the store says is left that one lease may take";
    POLICY_DELAY: "policies.NAME.delay", "mapping", Unset("past the burst, 429 at once"), Reload,
        "gcra, token-bucket: `{ max_wait, max_queued }`: a request past the burst waits for its turn (taken in the store) instead of a 429";
    POLICY_DELAY_MAX_WAIT: "policies.NAME.delay.max_wait", "duration", Required, Reload,
        "the longest a request waits for its turn; a later turn is a 429; > 0, at most 1m";
    POLICY_DELAY_MAX_QUEUED: "policies.NAME.delay.max_queued", "number", Value("100"), Reload,
        "the most requests of one route waiting at once in this sidecar; past it, 429 and the turn given back";
    POLICY_NEAR_LIMIT: "policies.NAME.near_limit", "percentage", Value("80%"), Reload,
        "an admitted request that has used more than this share of the quota counts in `sluice_near_limit_total`";
    POLICY_HEADERS: "policies.NAME.headers", "`on`, `off`", Value("on"), Reload,
        "`off`: the policy is never announced: no `RateLimit`, `RateLimit-Policy` or `Retry-After` for it, nor a retry time in its default body";
    POLICY_RETRY_AFTER: "policies.NAME.retry_after", "duration", Value("1s"), Reload,
        "concurrency: `Retry-After` of the 503 over its limit; > 0";
    ROUTE_NAME: "routes[].name", "text", Required, Reload,
        "the route's name in metrics, logs and `sluice check`; unique";
    ROUTE_MATCH_METHODS: "routes[].match.methods", "list", Unset("any method"), Reload,
        "the methods the route matches";
    ROUTE_MATCH_PATH: "routes[].match.path", "text", Unset("any path"), Reload,
        "the whole path, `{name}` standing for one segment; excludes `path_prefix`";
    ROUTE_MATCH_PATH_PREFIX: "routes[].match.path_prefix", "text", Unset("any path"), Reload,
        "a path and everything below it, by whole segments";
    ROUTE_MATCH_CASE_SENSITIVE: "routes[].match.case_sensitive", "`true`, `false`", Value("false"), Reload,
        "`false`: the path's ASCII letters match in any case, as Express, Koa and Nest route; `true`: only as written";
    ROUTE_MATCH_FORMAT_SUFFIX: "routes[].match.format_suffix", "`true`, `false`", Value("false"), Reload,
        "also match the path with a format suffix (`/users/1.json`)";
    ROUTE_MATCH_HOSTS: "routes[].match.hosts", "list", Unset("any host"), Reload,
        "the host the request names (`:authority` or `Host`, port and one trailing dot left out, any letter case): `api.example.com`, or `*.example.com` for one or more labels below `example.com`, never `example.com` itself";
    ROUTE_MATCH_HEADERS: "routes[].match.headers", "mapping", Unset("any headers"), Reload,
        "`NAME: VALUE`, the value exactly as sent (case-sensitive), or `NAME: { present: true }`, sent with any value; a request sending one of these headers twice is refused (400)";
    ROUTE_MATCH_QUERY: "routes[].match.query", "mapping", Unset("any query"), Reload,
        "`NAME: VALUE` or `NAME: { present: true }`, names and values as the app decodes them (`%76ersion` is `version`, `+` a space; names in any case); a request giving one of these parameters two different values is refused (400)";
    ROUTE_POLICY: "routes[].policy", "text", Required, Reload,
        "a policy's name, or `none` for no limit; unless `limits` is written";
    ROUTE_SUBJECT: "routes[].subject", "list", Value("client_ip"), Reload,
        "who is counted: `client_ip`, `header:NAME`, `jwt:CLAIM` (a verified token's claim), `global`, or `{ all: [...] }` (the combination, present when every part is); a list is tried in order and the first present counts";
    ROUTE_COST: "routes[].cost", "number or mapping", Value("1"), Reload,
        "units one request takes from the policy, or `{ from_response_header, max, default, reserve }`; not for concurrency";
    ROUTE_TIERS: "routes[].tiers", "mapping", Unset("one policy for every request"), Reload,
        "in place of `policy`: the policy follows a header a gateway in `trusted_from` sets, `{ header, trusted_from, policies, default }`, or a verified token's claim, `{ claim, policies, default }`";
    ROUTE_TIERS_HEADER: "routes[].tiers.header", "header name", Unset("`claim` instead"), Reload,
        "the header whose value chooses the tier; believed only from `trusted_from`, removed on every route from anyone else's request";
    ROUTE_TIERS_CLAIM: "routes[].tiers.claim", "text", Unset("`header` instead"), Reload,
        "the claim of a verified token (`identity.jwt`) whose value chooses the tier";
    ROUTE_TIERS_POLICIES: "routes[].tiers.policies", "mapping", Required, Reload,
        "each value of the header and its policy (`none`: no limit)";
    ROUTE_TIERS_DEFAULT: "routes[].tiers.default", "text", Required, Reload,
        "the policy when the header or claim is absent or not listed, the header is sent twice or by a peer not in `trusted_from`, or the token does not check out";
    ROUTE_TIERS_TRUSTED_FROM: "routes[].tiers.trusted_from", "list of CIDRs", Unset("the header is never believed"), Reload,
        "the components that set the header (an auth gateway): the TCP peer, or the client a PROXY protocol header names; not `identity.trusted_proxies`, whose proxies pass a client's own header through";
    ROUTE_COST_FROM_RESPONSE_HEADER: "routes[].cost.from_response_header", "header name", Required, Reload,
        "charge the number the app's response reports in this header (`reserve` units held before forwarding, settled when the response head arrives)";
    ROUTE_COST_MAX: "routes[].cost.max", "number", Derived("the policy's maximum cost"), Reload,
        "the most one response is charged; a larger report is charged this";
    ROUTE_COST_DEFAULT: "routes[].cost.default", "number", Derived("`max`"), Reload,
        "charged when the header is missing or not a whole number";
    ROUTE_COST_RESERVE: "routes[].cost.reserve", "number", Derived("`default`, at least 1"), Reload,
        "units held before forwarding, settled to the reported cost when the response head arrives";
    ROUTE_CHARGE: "routes[].charge", "mapping", Unset("charged before forwarding"), Reload,
        "`{ on: response, statuses: [...] }`: a unit reserved before forwarding, kept for a listed status, given back otherwise";
    ROUTE_CHARGE_ON: "routes[].charge.on", "`request`, `response`", Derived("`response` with a cost from the response, else `request`"), Reload,
        "when the limit is charged";
    ROUTE_CHARGE_STATUSES: "routes[].charge.statuses", "list of statuses", Unset("every status the app answers"), Reload,
        "only responses with one of these statuses are charged (`on: response`)";
    ROUTE_LIMITS: "routes[].limits", "list", Unset("one limit: `policy`, `subject`, `cost`"), Reload,
        "several limits, each `{ policy, subject, cost }`; every one must pass";
    ROUTE_LIMITS_POLICY: "routes[].limits[].policy", "text", Required, Reload,
        "this limit's policy";
    ROUTE_LIMITS_SUBJECT: "routes[].limits[].subject", "list", Value("client_ip"), Reload,
        "this limit's subject";
    ROUTE_LIMITS_COST: "routes[].limits[].cost", "number or mapping", Value("1"), Reload,
        "this limit's cost";
    ROUTE_LIMITS_TIERS: "routes[].limits[].tiers", "mapping", Unset("one policy for every request"), Reload,
        "in place of `policy`: the policy follows a header a gateway in `trusted_from` sets, `{ header, trusted_from, policies, default }`, or a verified token's claim, `{ claim, policies, default }`";
    ROUTE_LIMITS_TIERS_HEADER: "routes[].limits[].tiers.header", "header name", Unset("`claim` instead"), Reload,
        "the header whose value chooses the tier; believed only from `trusted_from`, removed on every route from anyone else's request";
    ROUTE_LIMITS_TIERS_CLAIM: "routes[].limits[].tiers.claim", "text", Unset("`header` instead"), Reload,
        "the claim of a verified token (`identity.jwt`) whose value chooses the tier";
    ROUTE_LIMITS_TIERS_POLICIES: "routes[].limits[].tiers.policies", "mapping", Required, Reload,
        "each value of the header and its policy (`none`: no limit)";
    ROUTE_LIMITS_TIERS_DEFAULT: "routes[].limits[].tiers.default", "text", Required, Reload,
        "the policy when the header or claim is absent or not listed, the header is sent twice or by a peer not in `trusted_from`, or the token does not check out";
    ROUTE_LIMITS_TIERS_TRUSTED_FROM: "routes[].limits[].tiers.trusted_from", "list of CIDRs", Unset("the header is never believed"), Reload,
        "the components that set the header (an auth gateway): the TCP peer, or the client a PROXY protocol header names; not `identity.trusted_proxies`, whose proxies pass a client's own header through";
    ROUTE_LIMITS_COST_FROM_RESPONSE_HEADER: "routes[].limits[].cost.from_response_header", "header name", Required, Reload,
        "charge the number the app's response reports in this header (`reserve` units held before forwarding, settled when the response head arrives)";
    ROUTE_LIMITS_COST_MAX: "routes[].limits[].cost.max", "number", Derived("the policy's maximum cost"), Reload,
        "the most one response is charged; a larger report is charged this";
    ROUTE_LIMITS_COST_DEFAULT: "routes[].limits[].cost.default", "number", Derived("`max`"), Reload,
        "charged when the header is missing or not a whole number";
    ROUTE_LIMITS_COST_RESERVE: "routes[].limits[].cost.reserve", "number", Derived("`default`, at least 1"), Reload,
        "units held before forwarding, settled to the reported cost when the response head arrives";
    ROUTE_LIMITS_CHARGE: "routes[].limits[].charge", "mapping", Unset("charged before forwarding"), Reload,
        "`{ on: response, statuses: [...] }`: a unit reserved before forwarding, kept for a listed status, given back otherwise";
    ROUTE_LIMITS_CHARGE_ON: "routes[].limits[].charge.on", "`request`, `response`", Derived("`response` with a cost from the response, else `request`"), Reload,
        "when the limit is charged";
    ROUTE_LIMITS_CHARGE_STATUSES: "routes[].limits[].charge.statuses", "list of statuses", Unset("every status the app answers"), Reload,
        "only responses with one of these statuses are charged (`on: response`)";
    ROUTE_RESPONSES: "routes[].responses", "mapping", Unset("the global `responses.refused` and `responses.unavailable`"), Reload,
        "`{ refused, unavailable }`, each as under `responses`; each one written replaces the global one whole, for this route";
    ROUTE_LIMITS_EXEMPT: "routes[].limits[].exempt", "list of CIDRs", Unset("no address skips this limit"), Reload,
        "requests from these networks skip this limit (beside the route's `exempt`), counted in `sluice_requests_exempted_total`";
    ROUTE_UPGRADES: "routes[].upgrades", "list", Value("[websocket]"), Reload,
        "the `Upgrade` protocols the route passes on; `[]` passes none";
    ROUTE_EXEMPT: "routes[].exempt", "list of CIDRs", Unset("no address skips a limit"), Reload,
        "requests whose client address (as `client_ip` resolves it, behind trusted proxies and PROXY protocol) is in one of these networks skip every limit of the route, counted in `sluice_requests_exempted_total`";
    ROUTE_DENY: "routes[].deny", "list of CIDRs", Unset("no address is refused"), Reload,
        "requests whose client address (as `client_ip` resolves it) is in one of these networks are answered 403 before any limit, never forwarded, counted in `sluice_requests_denied_total`";
    DEFAULT_ROUTE_POLICY: "default.policy", "text", Required, Reload,
        "the policy of a request no route matches, or `none`; no `default` at all is `policy: none`";
    DEFAULT_ROUTE_SUBJECT: "default.subject", "list", Value("client_ip"), Reload,
        "its subject";
    DEFAULT_ROUTE_TIERS: "default.tiers", "mapping", Unset("one policy for every request"), Reload,
        "in place of `policy`: the policy follows a header a gateway in `trusted_from` sets, `{ header, trusted_from, policies, default }`, or a verified token's claim, `{ claim, policies, default }`";
    DEFAULT_ROUTE_TIERS_HEADER: "default.tiers.header", "header name", Unset("`claim` instead"), Reload,
        "the header whose value chooses the tier; believed only from `trusted_from`, removed on every route from anyone else's request";
    DEFAULT_ROUTE_TIERS_CLAIM: "default.tiers.claim", "text", Unset("`header` instead"), Reload,
        "the claim of a verified token (`identity.jwt`) whose value chooses the tier";
    DEFAULT_ROUTE_TIERS_POLICIES: "default.tiers.policies", "mapping", Required, Reload,
        "each value of the header and its policy (`none`: no limit)";
    DEFAULT_ROUTE_TIERS_DEFAULT: "default.tiers.default", "text", Required, Reload,
        "the policy when the header or claim is absent or not listed, the header is sent twice or by a peer not in `trusted_from`, or the token does not check out";
    DEFAULT_ROUTE_TIERS_TRUSTED_FROM: "default.tiers.trusted_from", "list of CIDRs", Unset("the header is never believed"), Reload,
        "the components that set the header (an auth gateway): the TCP peer, or the client a PROXY protocol header names; not `identity.trusted_proxies`, whose proxies pass a client's own header through";
    DEFAULT_ROUTE_LIMITS: "default.limits", "list", Unset("one limit, or none"), Reload,
        "several limits, as in a route";
    DEFAULT_ROUTE_LIMITS_POLICY: "default.limits[].policy", "text", Required, Reload,
        "each limit's policy";
    DEFAULT_ROUTE_LIMITS_SUBJECT: "default.limits[].subject", "list", Value("client_ip"), Reload,
        "each limit's subject";
    DEFAULT_ROUTE_LIMITS_COST: "default.limits[].cost", "number or mapping", Value("1"), Reload,
        "each limit's cost";
    DEFAULT_ROUTE_LIMITS_TIERS: "default.limits[].tiers", "mapping", Unset("one policy for every request"), Reload,
        "in place of `policy`: the policy follows a header a gateway in `trusted_from` sets, `{ header, trusted_from, policies, default }`, or a verified token's claim, `{ claim, policies, default }`";
    DEFAULT_ROUTE_LIMITS_TIERS_HEADER: "default.limits[].tiers.header", "header name", Unset("`claim` instead"), Reload,
        "the header whose value chooses the tier; believed only from `trusted_from`, removed on every route from anyone else's request";
    DEFAULT_ROUTE_LIMITS_TIERS_CLAIM: "default.limits[].tiers.claim", "text", Unset("`header` instead"), Reload,
        "the claim of a verified token (`identity.jwt`) whose value chooses the tier";
    DEFAULT_ROUTE_LIMITS_TIERS_POLICIES: "default.limits[].tiers.policies", "mapping", Required, Reload,
        "each value of the header and its policy (`none`: no limit)";
    DEFAULT_ROUTE_LIMITS_TIERS_DEFAULT: "default.limits[].tiers.default", "text", Required, Reload,
        "the policy when the header or claim is absent or not listed, the header is sent twice or by a peer not in `trusted_from`, or the token does not check out";
    DEFAULT_ROUTE_LIMITS_TIERS_TRUSTED_FROM: "default.limits[].tiers.trusted_from", "list of CIDRs", Unset("the header is never believed"), Reload,
        "the components that set the header (an auth gateway): the TCP peer, or the client a PROXY protocol header names; not `identity.trusted_proxies`, whose proxies pass a client's own header through";
    DEFAULT_ROUTE_LIMITS_COST_FROM_RESPONSE_HEADER: "default.limits[].cost.from_response_header", "header name", Required, Reload,
        "charge the number the app's response reports in this header (`reserve` units held before forwarding, settled when the response head arrives)";
    DEFAULT_ROUTE_LIMITS_COST_MAX: "default.limits[].cost.max", "number", Derived("the policy's maximum cost"), Reload,
        "the most one response is charged; a larger report is charged this";
    DEFAULT_ROUTE_LIMITS_COST_DEFAULT: "default.limits[].cost.default", "number", Derived("`max`"), Reload,
        "charged when the header is missing or not a whole number";
    DEFAULT_ROUTE_LIMITS_COST_RESERVE: "default.limits[].cost.reserve", "number", Derived("`default`, at least 1"), Reload,
        "units held before forwarding, settled to the reported cost when the response head arrives";
    DEFAULT_ROUTE_LIMITS_CHARGE: "default.limits[].charge", "mapping", Unset("charged before forwarding"), Reload,
        "`{ on: response, statuses: [...] }`: a unit reserved before forwarding, kept for a listed status, given back otherwise";
    DEFAULT_ROUTE_LIMITS_CHARGE_ON: "default.limits[].charge.on", "`request`, `response`", Derived("`response` with a cost from the response, else `request`"), Reload,
        "when the limit is charged";
    DEFAULT_ROUTE_LIMITS_CHARGE_STATUSES: "default.limits[].charge.statuses", "list of statuses", Unset("every status the app answers"), Reload,
        "only responses with one of these statuses are charged (`on: response`)";
    DEFAULT_ROUTE_RESPONSES: "default.responses", "mapping", Unset("the global ones"), Reload,
        "`{ refused, unavailable }`, as in a route";
    DEFAULT_ROUTE_LIMITS_EXEMPT: "default.limits[].exempt", "list of CIDRs", Unset("no address skips this limit"), Reload,
        "requests from these networks skip this limit";
    DEFAULT_ROUTE_UPGRADES: "default.upgrades", "list", Value("[websocket]"), Reload,
        "the `Upgrade` protocols passed on for it";
    DEFAULT_ROUTE_EXEMPT: "default.exempt", "list of CIDRs", Unset("no address skips a limit"), Reload,
        "requests from these networks skip every limit of `default`";
    DEFAULT_ROUTE_DENY: "default.deny", "list of CIDRs", Unset("no address is refused"), Reload,
        "requests no route matched from these networks are answered 403";
}

/// The key at `path`.
pub fn find(path: &str) -> Option<&'static Key> {
    ALL.iter().chain(ENTRIES).find(|k| k.path == path)
}

/// Both tables, as the configuration reference shows them.
pub fn markdown() -> String {
    let mut out = table(ALL);
    out.push_str("\nIn each policy, each route and `default`:\n\n");
    out.push_str(&table(ENTRIES));
    out
}

fn table(keys: &[Key]) -> String {
    let mut out =
        String::from("| key | type | default | applied | meaning |\n|---|---|---|---|---|\n");
    for key in keys {
        let default = match key.default {
            Value(value) => format!("`{value}`"),
            Derived(how) => how.to_owned(),
            Required => "**required**".to_owned(),
            Unset(what) => format!("unset: {what}"),
        };
        let applied = match key.applied {
            Applied::Reload => "on reload",
            Applied::Restart => "at start",
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {default} | {applied} | {} |",
            key.path, key.kind, key.meaning
        );
    }
    out
}

/// The table as `sluice keys` prints it: one key a line, its default as
/// it would be written.
pub fn text() -> String {
    let mut out = String::new();
    for key in ALL.iter().chain(ENTRIES) {
        let default = match key.default {
            Value(value) => value.to_owned(),
            Derived(how) => format!("({how})"),
            Required => "(required)".to_owned(),
            Unset(what) => format!("(unset: {what})"),
        };
        let applied = match key.applied {
            Applied::Reload => "reload",
            Applied::Restart => "restart",
        };
        let _ = writeln!(out, "{}: {default}  # {applied}; {}", key.path, key.meaning);
    }
    out
}

#[cfg(test)]
mod tests;
