//! Sealed records (`[store] encryption_keys`, crates/store/src/seal/) on
//! every store: what the store keeps holds no byte of the response (its
//! tables, its Redis values, its SQLite file, read directly), the replay
//! is byte-identical, and a record under a key no longer configured or a
//! sealed value copied onto another record is refused, never replayed.
//! Each raw read has its negative control: the same record written
//! without keys shows the marker to the same reader (on a Redis Cluster,
//! every node is read, each for the keys it holds).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::config::UnknownOutcome;
use idemgate::store::seal::{Codec, Keyring, OpenError, SealedStore, sealed_with};
use idemgate::store::{
    Backend as Backing, Claim, ClaimRequest, RecordKey, Store, StoreError, StoredResponse,
};

use crate::features::sealed::{K1, K2, payment_intent};
use crate::support::{Backend, TestStore, per_backend};

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);
/// In the sealed records' bodies and headers: never in the store.
const MARKER: &str = "MARKER-4e1f-pi-secret";
/// In the plain records': found by the same readers.
const PLAIN_MARKER: &str = "PLAINMARK-77c0-visible";

fn keyring(entries: &[(&str, &str)]) -> Arc<Keyring> {
    let entries: Vec<String> = entries.iter().map(|(id, k)| format!("{id}:{k}")).collect();
    Arc::new(Keyring::parse(&entries).unwrap())
}

/// What the wrapper reported on each replay it opened.
type Opened = Arc<Mutex<Vec<Result<Option<String>, OpenError>>>>;

/// `inner` sealed under `keys`, compressing with the default codec.
fn sealed(inner: &Arc<dyn Backing>, keys: Arc<Keyring>) -> (SealedStore, Opened) {
    sealed_with_codec(
        inner,
        keys,
        Some(idemgate::config::DEFAULT_STORE_COMPRESSION),
    )
}

/// `inner` sealed under `keys`, compressing with `compression` (none: not
/// compressed).
fn sealed_with_codec(
    inner: &Arc<dyn Backing>,
    keys: Arc<Keyring>,
    compression: Option<Codec>,
) -> (SealedStore, Opened) {
    let opened: Opened = Arc::default();
    let log = opened.clone();
    let inner: Arc<dyn Store> = inner.clone();
    let on_open = Box::new(move |_: &RecordKey, r: Result<Option<&str>, &OpenError>| {
        let r = r.map(|id| id.map(str::to_string)).map_err(Clone::clone);
        log.lock().unwrap().push(r);
    });
    (
        SealedStore::new(inner, Some(keys), compression, on_open),
        opened,
    )
}

fn key(k: &str) -> RecordKey {
    RecordKey {
        route: "payments".into(),
        scope: vec![0xab; 32],
        key: k.into(),
    }
}

/// The name of the header that carries `marker`: names are hidden too.
fn header_name(marker: &str) -> String {
    format!("x-note-{}", marker.to_lowercase())
}

/// A PaymentIntent-shaped JSON response carrying `marker` in its body and
/// in a header (name and value).
fn payment(marker: &str) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append("content-type", HeaderValue::from_static("application/json"));
    let name = http::HeaderName::try_from(header_name(marker)).unwrap();
    headers.append(name, HeaderValue::from_str(marker).unwrap());
    headers.append("set-cookie", HeaderValue::from_static("a=1"));
    headers.append("set-cookie", HeaderValue::from_static("b=2"));
    StoredResponse {
        status: StatusCode::PAYMENT_REQUIRED,
        headers,
        body: Bytes::from(payment_intent(marker)),
    }
}

async fn claim(store: &dyn Store, k: &RecordKey) -> Result<Claim, StoreError> {
    store
        .claim(&ClaimRequest {
            key: k,
            fingerprint: &[7; 32],
            attempt: idemgate::store::new_attempt_id(),
            lease: LEASE,
            retention: RETENTION,
            on_unknown_outcome: UnknownOutcome::Hold,
            inquire_after: Duration::ZERO,
        })
        .await
}

/// Claim `k` and record `response` through `store`.
async fn record(store: &dyn Store, k: &RecordKey, response: &StoredResponse) {
    let Ok(Claim::Claimed { token, .. }) = claim(store, k).await else {
        panic!("{k:?} is new");
    };
    store.complete(k, token, response, RETENTION).await.unwrap();
}

/// The replay of `k` through `store`.
async fn replay(store: &dyn Store, k: &RecordKey) -> Result<StoredResponse, StoreError> {
    match claim(store, k).await? {
        Claim::Replay(response) => Ok(response),
        other => panic!("expected a replay of {k:?}, got {other:?}"),
    }
}

/// Every byte the store keeps, read around idemgate: every PostgreSQL
/// table's rows as text (bytes as hex), every Redis value under the
/// test's prefix, the SQLite file and its log. `None`: memory has none.
async fn raw_bytes(storage: &TestStore) -> Option<Vec<u8>> {
    let mut raw = Vec::new();
    match storage.backend {
        Backend::Memory => return None,
        Backend::Sqlite => {
            let path = storage.url.strip_prefix("sqlite://").unwrap();
            for file in [path.to_string(), format!("{path}-wal")] {
                raw.extend(std::fs::read(&file).unwrap_or_default());
            }
        }
        Backend::Postgres | Backend::Front | Backend::Redis | Backend::RedisCluster => {}
    }
    if let Some(url) = storage.pg_url() {
        raw.extend(postgres_rows(url).await);
    }
    let nodes = match storage.backend {
        Backend::Redis | Backend::Front => vec![crate::support::store::redis_url()],
        // A key lives on the node serving its slot: every node is read.
        Backend::RedisCluster => crate::support::store::redis_cluster_urls(),
        Backend::Postgres | Backend::Sqlite | Backend::Memory => Vec::new(),
    };
    if !nodes.is_empty() {
        raw.extend(redis_values(&nodes, storage.prefix()).await);
    }
    Some(raw)
}

async fn postgres_rows(url: &str) -> Vec<u8> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let mut text = String::new();
    for table in tables {
        let sql = format!("SELECT coalesce(string_agg(t::text, E'\\n'), '') FROM \"{table}\" t");
        let rows: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        text.push_str(&rows);
    }
    // Bytes show as `\x<hex>`: decode every hex run back into bytes too.
    let mut raw = text.clone().into_bytes();
    for run in text.split(|c: char| !c.is_ascii_hexdigit()) {
        let even = &run[..run.len() & !1];
        raw.extend(hex::decode(even).unwrap_or_default());
    }
    raw
}

/// Every value under `prefix` on each of `nodes` (one server, or every
/// node of a cluster, each read for the keys it holds itself).
async fn redis_values(nodes: &[String], prefix: &str) -> Vec<u8> {
    use deadpool_redis::redis::{self, Value};
    let mut raw = Vec::new();
    let mut found = 0;
    for node in nodes {
        let client = redis::Client::open(node.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        if nodes.len() > 1 {
            // A cluster's replica serves reads of its own keys only so.
            let _: redis::RedisResult<()> = redis::cmd("READONLY").query_async(&mut conn).await;
        }
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        found += keys.len();
        for key in keys {
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            let read = match kind.as_str() {
                "string" => redis::cmd("GET").arg(&key).clone(),
                "hash" => redis::cmd("HGETALL").arg(&key).clone(),
                "list" => redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).clone(),
                "set" => redis::cmd("SMEMBERS").arg(&key).clone(),
                "zset" => redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).clone(),
                "stream" => redis::cmd("XRANGE").arg(&key).arg("-").arg("+").clone(),
                _ => continue,
            };
            let value: Value = read.query_async(&mut conn).await.unwrap();
            flatten(&value, &mut raw);
        }
    }
    assert!(found > 0, "nothing under {prefix}");
    raw
}

fn flatten(value: &deadpool_redis::redis::Value, out: &mut Vec<u8>) {
    use deadpool_redis::redis::Value;
    match value {
        Value::BulkString(bytes) => out.extend_from_slice(bytes),
        Value::SimpleString(s) => out.extend_from_slice(s.as_bytes()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|v| flatten(v, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        other => out.extend_from_slice(format!("{other:?}").as_bytes()),
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// A sealed record keeps no byte of the response in the store and replays
/// byte-identical; a plain one, recorded before keys were set, still
/// replays as it was (unless plain records are refused), and its marker
/// is where the reader looks (the negative control).
async fn the_store_never_sees_the_response(b: Backend) {
    let storage = TestStore::new(b).await;
    let backend = storage.open().await;
    let (store, opened) = sealed(&backend, keyring(&[("k1", K1)]));
    let (secret, plain) = (key("sealed"), key("plain"));
    record(&store, &secret, &payment(MARKER)).await;
    record(backend.as_ref(), &plain, &payment(PLAIN_MARKER)).await;
    assert_eq!(replay(&store, &secret).await.unwrap(), payment(MARKER));
    assert_eq!(replay(&store, &plain).await.unwrap(), payment(PLAIN_MARKER));
    // What the store itself answers is the sealed form.
    let stored = replay(backend.as_ref(), &secret).await.unwrap();
    assert_eq!(sealed_with(&stored).as_deref(), Some("k1"));
    assert!(!contains(&stored.body, MARKER));
    assert_eq!(
        *opened.lock().unwrap(),
        [Ok(Some("k1".to_string())), Ok(None)]
    );
    // Once plain records are refused, the plain one is never replayed.
    let inner: Arc<dyn Store> = backend.clone();
    let strict = SealedStore::new(
        inner,
        Some(keyring(&[("k1", K1)])),
        Some(Codec::Zstd),
        Box::new(|_, _| {}),
    )
    .refusing_plain(true);
    assert_eq!(replay(&strict, &secret).await.unwrap(), payment(MARKER));
    match replay(&strict, &plain).await {
        Err(StoreError::Sealed(OpenError::Plain)) => {}
        other => panic!("a plain record must be refused, got {other:?}"),
    }
    if let Some(raw) = raw_bytes(&storage).await {
        assert!(contains(&raw, PLAIN_MARKER), "the reader finds nothing");
        assert!(
            contains(&raw, &header_name(PLAIN_MARKER)),
            "the reader finds no header"
        );
        assert!(!contains(&raw, MARKER), "the sealed marker is in the store");
        assert!(
            !contains(&raw, &header_name(MARKER)),
            "a header name is in the store"
        );
    }
}

/// Rotation: records sealed under k1 replay under `[k2, k1]`, which seals
/// new ones under k2; under `[k2]` alone a k1 record is refused with its
/// key id (and without any key, too), and a record sealed for another
/// record (its stored value copied onto this one's) never opens, on
/// every store.
async fn rotation_missing_keys_and_copies(b: Backend) {
    let storage = TestStore::new(b).await;
    let backend = storage.open().await;
    let (old, _) = sealed(&backend, keyring(&[("k1", K1)]));
    let first = key("first");
    record(&old, &first, &payment(MARKER)).await;

    let (rotated, _) = sealed(&backend, keyring(&[("k2", K2), ("k1", K1)]));
    assert_eq!(replay(&rotated, &first).await.unwrap(), payment(MARKER));
    let second = key("second");
    record(&rotated, &second, &payment("two")).await;
    let stored = replay(backend.as_ref(), &second).await.unwrap();
    assert_eq!(sealed_with(&stored).as_deref(), Some("k2"));

    let (dropped, opened) = sealed(&backend, keyring(&[("k2", K2)]));
    assert_eq!(replay(&dropped, &second).await.unwrap(), payment("two"));
    match replay(&dropped, &first).await {
        Err(StoreError::Sealed(OpenError::UnknownKey(id))) => assert_eq!(id, "k1"),
        other => panic!("expected an unknown key, got {other:?}"),
    }
    assert_eq!(
        opened.lock().unwrap().last(),
        Some(&Err(OpenError::UnknownKey("k1".into())))
    );

    // Keys removed altogether: refused all the same, never the envelope.
    let inner: Arc<dyn Store> = backend.clone();
    let keyless = SealedStore::new(inner, None, Some(Codec::Lz4), Box::new(|_, _| {}));
    match replay(&keyless, &second).await {
        Err(StoreError::Sealed(OpenError::UnknownKey(id))) => assert_eq!(id, "k2"),
        other => panic!("expected an unknown key, got {other:?}"),
    }

    // `second`'s stored value, written as it is onto a third record.
    let copy = key("copy");
    record(backend.as_ref(), &copy, &stored).await;
    match replay(&rotated, &copy).await {
        Err(StoreError::Sealed(OpenError::Unauthentic(id))) => assert_eq!(id, "k2"),
        other => panic!("a copied value must not open, got {other:?}"),
    }
}

/// Each codec, and none, on every store: a record sealed with LZ4 or zstd
/// (or not compressed) keeps no byte of the response in the store and
/// replays byte-identical through a wrapper sealing with any of them, so
/// switching `[store] compression` either way leaves every record
/// readable. The control: the codecs' sealed values differ in size, so
/// each wrapper did compress with its own.
async fn every_codec_replays_after_a_switch(b: Backend) {
    let storage = TestStore::new(b).await;
    let backend = storage.open().await;
    let keys = keyring(&[("k1", K1)]);
    let ways = [
        ("lz4", Some(Codec::Lz4)),
        ("zstd", Some(Codec::Zstd)),
        ("none", None),
    ];
    let mut sizes = Vec::new();
    for (name, compression) in ways {
        let (store, _) = sealed_with_codec(&backend, keys.clone(), compression);
        let k = key(&format!("by-{name}"));
        record(&store, &k, &payment(MARKER)).await;
        let stored = replay(backend.as_ref(), &k).await.unwrap();
        assert_eq!(sealed_with(&stored).as_deref(), Some("k1"));
        assert!(!contains(&stored.body, MARKER));
        sizes.push(stored.body.len());
    }
    for (name, _) in ways {
        for (reader, compression) in ways {
            let (store, opened) = sealed_with_codec(&backend, keys.clone(), compression);
            let k = key(&format!("by-{name}"));
            let replayed = replay(&store, &k).await.unwrap();
            assert_eq!(replayed, payment(MARKER), "{name} read by {reader}");
            assert_eq!(*opened.lock().unwrap(), [Ok(Some("k1".to_string()))]);
        }
    }
    let [lz4, zstd, none] = sizes[..] else {
        unreachable!()
    };
    assert!(
        zstd < lz4 && lz4 < none,
        "lz4 {lz4}, zstd {zstd}, none {none}"
    );
    if let Some(raw) = raw_bytes(&storage).await {
        assert!(!contains(&raw, MARKER), "the sealed marker is in the store");
    }
}

per_backend!(
    only [postgres, redis, redis_cluster, sqlite, memory, front]:
    the_store_never_sees_the_response,
    rotation_missing_keys_and_copies,
    every_codec_replays_after_a_switch,
);

/// The bytes a ~2 KiB payment object takes, plain and sealed (with each
/// codec, and without compression): what every store keeps (status, headers, body),
/// and what a PostgreSQL row takes (`pg_column_size`, after its own TOAST
/// compression). The figures are in the book (docs/src/operations/
/// protecting-stored-responses.md#cost); run with `--nocapture` to see them.
#[tokio::test]
async fn bytes_per_record_for_a_payment_object() {
    let storage = TestStore::new(Backend::Postgres).await;
    let backend = storage.open().await;
    let keys = keyring(&[("k1", K1)]);
    let response = payment("customer-1842");
    let kept = |r: &StoredResponse| {
        let headers: usize = r
            .headers
            .iter()
            .map(|(n, v)| 6 + n.as_str().len() + v.len())
            .sum();
        2 + headers + r.body.len()
    };
    let plain = kept(&response);
    let id = key("size");
    let seal = |compression| {
        kept(&idemgate::store::seal::seal(
            &keys,
            &id,
            &response,
            compression,
        ))
    };
    let (compressed, lz4) = (seal(Some(Codec::Zstd)), seal(Some(Codec::Lz4)));
    let uncompressed = seal(None);

    let inner: Arc<dyn Store> = backend.clone();
    let unpacked = SealedStore::new(inner, Some(keys.clone()), None, Box::new(|_, _| {}));
    let (packed, _) = sealed_with_codec(&backend, keys.clone(), Some(Codec::Zstd));
    let (packed_lz4, _) = sealed_with_codec(&backend, keys, Some(Codec::Lz4));
    record(backend.as_ref(), &key("row-plain"), &response).await;
    record(&packed, &key("row-sealed"), &response).await;
    record(&unpacked, &key("row-uncompressed"), &response).await;
    record(&packed_lz4, &key("row-lz4"), &response).await;
    let mut conn = {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&storage.url).await.unwrap()
    };
    let mut row = async |k: &str| -> i32 {
        sqlx::query_scalar("SELECT pg_column_size(t.*) FROM idemgate_records t WHERE key = $1")
            .bind(k)
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    let rows = [
        row("row-plain").await,
        row("row-sealed").await,
        row("row-uncompressed").await,
        row("row-lz4").await,
    ];
    eprintln!(
        "payment object: body {} B; kept plain {plain} B, sealed+zstd {compressed} B, \
         sealed+lz4 {lz4} B, sealed alone {uncompressed} B; PostgreSQL row plain {} B, \
         sealed+zstd {} B, sealed+lz4 {} B, sealed alone {} B",
        response.body.len(),
        rows[0],
        rows[1],
        rows[3],
        rows[2]
    );
    assert!((1024..=3072).contains(&response.body.len()));
    // Sealing alone costs its envelope (about 60 bytes); compression more
    // than pays for it.
    assert!(uncompressed > plain && uncompressed < plain + 80);
    assert!(compressed * 10 < plain * 6, "{compressed} vs {plain}");
    assert!(lz4 * 10 < plain * 8, "{lz4} vs {plain}");
    // zstd's row is smaller than plain (whose own TOAST compression a
    // ciphertext defeats); LZ4's need not be.
    assert!(rows[1] < rows[0] && rows[1] < rows[3], "{rows:?}");
}
