//! The pipeline of DESIGN.md §2 end to end: the real gateway on port 0 in
//! front of a real upstream on port 0, on a fresh PostgreSQL database.

mod common;


use common::*;
use http::StatusCode;

struct Setup {
    db: TestDb,
    upstream: Upstream,
    gateway: Gateway,
    client: HttpClient,
}

async fn setup(extra: &str) -> Setup {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&config_text(&db.url, &upstream.url(), extra)).await;
    Setup {
        db,
        upstream,
        gateway,
        client: client(),
    }
}

#[tokio::test]
async fn replay_is_byte_exact_with_location_and_etag() {
    let s = setup("").await;
    let url = s.gateway.url("/v1/binary");
    let first = post(&s.client, &url, "k-bin", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.is_replay());
    assert_eq!(&first.body[..], BINARY_BODY);
    let second = post(&s.client, &url, "k-bin", "{}").await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(second.is_replay());
    assert_eq!(&second.body[..], BINARY_BODY);
    assert_eq!(second.header("location"), Some("/v1/things/42"));
    assert_eq!(second.header("etag"), Some("\"v1-abc\""));
    assert_eq!(second.header("content-type"), Some("application/octet-stream"));
    assert_eq!(s.upstream.count("k-bin"), 1);
    drop(s.db);
}
