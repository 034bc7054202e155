//! Readiness (`/readyz` on the admin listener): not ready until the
//! database is migrated, ready once it is. (Readiness during a store outage
//! is in `guarantees/g8_store_outages.rs`.)

use http::StatusCode;

use crate::support::{Gateway, Set, TestConfig, TestDb, Upstream};

#[tokio::test]
async fn readiness_needs_a_migrated_database() {
    let db = TestDb::new().await;
    let upstream = Upstream::start().await;
    let config = TestConfig::new(&db.url, &upstream.url());
    let unmigrated = config.clone().store(|s| {
        s.set("migrate", false);
    });
    let gateway = Gateway::start(&unmigrated).await;
    assert_eq!(gateway.readyz().await, StatusCode::SERVICE_UNAVAILABLE);
    let migrated = Gateway::start(&config).await;
    assert_eq!(migrated.readyz().await, StatusCode::OK);
    assert_eq!(
        gateway.readyz().await,
        StatusCode::OK,
        "ready once migrated"
    );
}
