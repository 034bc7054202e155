//! PostgreSQL over TLS (sqlx's rustls on ring): a private cluster that
//! accepts TLS connections only, reached with `sslmode=require` and with
//! `sslmode=verify-full` and the right `sslrootcert` (and not without
//! `sslmode`: cleartext unless asked); a wrong CA stops the gateway at
//! start with an error that says to check the TLS settings.

use crate::support::pki::Pki;
use crate::support::process::{GatewayProcess, refuses_to_start};
use crate::support::servers::PgCluster;
use crate::support::{TestConfig, Upstream};

/// Open the store at `url` as the gateway would (migrations included) and
/// ping it.
async fn open(url: &str) -> Result<(), String> {
    let config = idemgate::Config::parse(&TestConfig::new(url, "http://127.0.0.1:9").to_string())
        .map_err(|e| e.to_string())?;
    let store = idemgate::store::open(&config.store)
        .await
        .map_err(|e| e.to_string())?;
    store.ping().await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn postgres_over_tls_connects_and_verifies_the_server() {
    let pki = Pki::new();
    let cert = pki.issue("postgres", "IP:127.0.0.1");
    let cluster = PgCluster::with_ssl(&cert.cert, &cert.key).await;
    let url = cluster.url();
    let ca = pki.ca();
    let ca = ca.to_str().unwrap();

    // The control: the cluster refuses cleartext, so a store that opens
    // below spoke TLS. Without sslmode idemgate does not try TLS (not
    // libpq's `prefer`), so that is refused too.
    let plain = open(&format!("{url}?sslmode=disable")).await;
    assert!(plain.is_err(), "a cleartext connection was accepted");
    if std::env::var_os("PGSSLMODE").is_none() {
        let unsaid = open(&url).await;
        assert!(unsaid.is_err(), "no sslmode: TLS was used");
    }

    open(&format!("{url}?sslmode=require"))
        .await
        .expect("sslmode=require connects");
    open(&format!("{url}?sslmode=verify-ca&sslrootcert={ca}"))
        .await
        .expect("sslmode=verify-ca with the right CA connects");
    open(&format!("{url}?sslmode=verify-full&sslrootcert={ca}"))
        .await
        .expect("sslmode=verify-full with the right CA connects");
}

#[tokio::test]
async fn a_wrong_ca_stops_the_gateway_at_start() {
    let pki = Pki::new();
    let cert = pki.issue("postgres", "IP:127.0.0.1");
    let cluster = PgCluster::with_ssl(&cert.cert, &cert.key).await;
    let other = Pki::new();
    let upstream = Upstream::start().await;
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        cluster.url(),
        other.ca().display()
    );
    let stderr = refuses_to_start("pg-wrong-ca", &TestConfig::new(&url, &upstream.url())).await;
    assert!(
        stderr.contains("cannot reach store")
            && stderr.contains("invalid peer certificate")
            && stderr.contains("the TLS connection failed: check sslmode and sslrootcert"),
        "{stderr}"
    );

    // The control: the right CA starts.
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        cluster.url(),
        pki.ca().display()
    );
    let started = GatewayProcess::try_start_with_env(
        "pg-right-ca",
        &TestConfig::new(&url, &upstream.url()),
        &[],
    )
    .await;
    assert!(started.is_ok(), "{:?}", started.err());
}
