//! The settings of a route: each `[[routes]]` table, and `[defaults]`,
//! which may set any of them but `name` and `match` for all routes (a
//! route's own value wins; a table value such as `fingerprint` or `inquiry`
//! is replaced whole). Rows of the settings table (`super`); a reload
//! applies all of them, swapping the routes whole.

use super::DefaultValue::{Derived, Required, Toml, Unset};
use super::{Kind, Reload, Section, Setting};

super::rows! { ROUTE = Route {
    /// unique; part of the key space (renaming a route forgets its records)
    NAME "name" Text Required("required"), Applies;
    /// an exact path (`"/v1/charge"`) or a prefix ending in `/*` (`"/v1/payments/*"`, which also
    /// matches `/v1/payments`). The most specific route wins: exact, then the longest prefix
    MATCH "match" Text Required("required"), Applies;
    /// `http://host:port` or `https://host:port`, optionally with a base path (`http://h:1/base`
    /// sends `/v1/x` to `/base/v1/x`); no query. See [TLS on every side](../stores/tls.md)
    UPSTREAM "upstream" Text Required("required"), Applies;
    /// `https://` upstreams: a PEM file of CA certificates trusted besides the system's roots (a
    /// private CA); read when the config is loaded, so an unreadable or invalid file stops `check`
    /// and the start, naming the file and the route
    UPSTREAM_CA "upstream_ca" Text Unset("unset"), Applies;
    /// protected methods; requests with other methods are proxied untouched
    METHODS "methods" List Toml(r#"["POST", "PATCH"]"#), Applies;
    /// the header carrying the key; shorthand for `key_from = ["header:NAME"]`
    KEY_HEADER "key_header" Text Toml(r#""Idempotency-Key""#), Applies;
    /// where the key is read: parts `header:NAME`, `query:NAME`, `json:/pointer`; several form one
    /// composite key (at most 8). See [webhooks and event consumers](../guide/webhooks.md). Setting
    /// it and `key_header` in one table is an error; a route that sets either takes neither from
    /// `[defaults]`
    KEY_FROM "key_from" List Derived(r#"`["header:Idempotency-Key"]`"#), Applies;
    /// a protected request without a key (any part absent): `400` (`false`: proxied without
    /// idempotency)
    KEY_REQUIRED "key_required" Bool Toml("true"), Applies;
    /// if set, keys are scoped per value of this header (e.g. `"Authorization"`, `"X-Api-Key"`),
    /// stored only as its SHA-256 digest; unset: one key space per route. Shorthand for `scope_from
    /// = ["header:NAME"]`
    SCOPE_HEADER "scope_header" Text Unset("unset"), Applies;
    /// where the scope is read (the same part kinds as `key_from`; an absent part counts as no
    /// value); stored only as a SHA-256 digest. It shares no part with `key_from`
    SCOPE_FROM "scope_from" List Unset("unset"), Applies;
    /// how long a `completed` or `held` record is kept (≥ `lease`)
    RETENTION "retention" Duration Toml(r#""24h""#), Applies;
    /// how long an attempt owns its key without renewing (≥ 1s); renewed every third of it while
    /// the upstream works (renewal also keeps the record from expiring under the attempt)
    LEASE "lease" Duration Toml(r#""30s""#), Applies;
    /// longest wait for the upstream's whole response (head and body) on protected requests, for
    /// the response head on pass-through ones
    UPSTREAM_TIMEOUT "upstream_timeout" Duration Toml(r#""25s""#), Applies;
    /// larger request bodies of protected requests get `413`
    MAX_REQUEST_BODY "max_request_body" Size Toml(r#""1MiB""#), Applies;
    /// a larger upstream response is not recorded: the key turns `held`, then that response is
    /// streamed to this client only
    MAX_RECORDED_RESPONSE "max_recorded_response" Size Toml(r#""8MiB""#), Applies;
    /// `"hold"`: the key turns `held` when the outcome is unknown; `"release"`: the key is released
    /// and a retry is forwarded again; `"inquire"`: the gateway asks the upstream ([status
    /// inquiry](../guide/status-inquiry.md)), which needs the `inquiry` table
    ON_UNKNOWN_OUTCOME "on_unknown_outcome" Choice Toml(r#""hold""#), Applies;
    /// `http://` or `https://` URL with `{key}` (the key's value, percent-encoded) and `{scope}`
    /// (idemgate's digest of the scope, in hex; required on a scoped route) in its path or query,
    /// never its host nor a fragment; a `GET` to it asks about one key ([the lookup's
    /// contract](../guide/status-inquiry.md#the-contract-your-lookup-must-keep))
    INQUIRY_URL "inquiry.url" Text Required(r#"(required with `"inquire"`)"#), Applies;
    /// first question this long after the outcome became unknown (`check` warns when it is shorter
    /// than `upstream_timeout`)
    INQUIRY_AFTER "inquiry.after" Duration Derived("the route's `upstream_timeout`"), Applies;
    /// ask again this often (at least `1s`) while the answer settles nothing
    INQUIRY_EVERY "inquiry.every" Duration Toml(r#""30s""#), Applies;
    /// the last question is asked then, and the key turns `held` (`inquiry_gave_up`) unless it
    /// settles it; longer than `after`, and `give_up_after + upstream_timeout + 5s` shorter than
    /// `retention` (the record must outlive the last answer)
    INQUIRY_GIVE_UP_AFTER "inquiry.give_up_after" Duration Toml(r#""1h""#), Applies;
    /// static headers sent with every question (e.g. `Authorization = "Bearer ${TOKEN}"`)
    INQUIRY_HEADERS "inquiry.headers" Table Unset("none"), Applies;
    /// send the attempt's fencing token upstream as `Idempotency-Attempt` (default `true` on a
    /// route that inquires, unless the route or `[defaults]` sets it)
    FORWARD_ATTEMPT "forward_attempt" Bool Toml("false"), Applies;
    /// keyed answers that created or replayed a record carry `Idempotency-Expires` (an HTTP-date:
    /// the record is kept at least until then); default `false` on a shadow route unless the
    /// route or `[defaults]` sets it. See [how long a key is kept](../guide/clients.md#how-long-a-key-is-kept)
    EXPIRES_HEADER "expires_header" Bool Toml("true"), Applies;
    /// store unreachable at claim time: `"fail_closed"` answers `503` + `Retry-After: 1`;
    /// `"fail_open"` forwards without idempotency and logs a warning
    ON_STORE_ERROR "on_store_error" Choice Toml(r#""fail_closed""#), Applies;
    /// `"shadow"`: forward every request as if idemgate were absent (no `400`, `409`, `422` or
    /// replay; a store error never blocks), while keyed requests are still claimed and recorded and
    /// `idemgate_shadow_total{route, would}` counts what enforcing would have done. See [rolling
    /// out with shadow mode](../operations/shadow.md)
    MODE "mode" Choice Toml(r#""enforce""#), Applies;
    /// an in-flight duplicate gets `409` + `Retry-After`. `"wait"`: it waits for the first
    /// attempt's answer and gets it (the replay, or the held answer; a released key is claimed by
    /// one waiter and forwarded). See [duplicates that wait](../operations/waiting.md)
    CONCURRENT "concurrent" Choice Toml(r#""reject""#), Applies;
    /// `concurrent = "wait"` only: a duplicate still waiting after this long gets `409` +
    /// `Retry-After`. More than zero and at most `upstream_timeout` + `lease`
    WAIT_TIMEOUT "wait_timeout" Duration Toml(r#""10s""#), Applies;
    /// which upstream statuses are recorded; any other status releases the key (the response is
    /// sent, the next request forwards again)
    RECORD "record" List Toml(r#"["2xx", "3xx", "4xx", "!408", "!409", "!425", "!429"]"#), Applies;
    /// `false`: record the status and headers but not the body (webhook and event routes, whose
    /// sender needs only the status): a replay answers the same status and headers with an empty
    /// body, without the headers that describe one (see [webhooks](../guide/webhooks.md)), and an answer of any size is
    /// recorded, never held for `max_recorded_response`
    RECORD_BODY "record_body" Bool Toml("true"), Applies;
    /// response headers never recorded nor replayed. Setting it replaces this list
    REPLAY_HEADERS "replay_headers" List Toml(r#"["set-cookie", "date"]"#), Applies;
    /// the method is part of the fingerprint
    FINGERPRINT_METHOD "fingerprint.method" Bool Toml("true"), Applies;
    /// the path is part of it
    FINGERPRINT_PATH "fingerprint.path" Bool Toml("true"), Applies;
    /// the query string is part of it
    FINGERPRINT_QUERY "fingerprint.query" Bool Toml("true"), Applies;
    /// these request headers (all values, in order) are part of it
    FINGERPRINT_HEADERS "fingerprint.headers" List Toml("[]"), Applies;
    /// `"raw"`: the exact bytes; `"json"`: canonical JSON (keys sorted, whitespace dropped; a body
    /// that is not JSON is hashed raw); `"ignore"`: not part of it
    FINGERPRINT_BODY "fingerprint.body" Choice Toml(r#""raw""#), Applies;
    /// JSON pointers (`"/metadata/sent_at"`) removed before hashing; needs `body = "json"`
    FINGERPRINT_EXCLUDE "fingerprint.exclude" List Toml("[]"), Applies;
}}
