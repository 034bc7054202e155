//! The differential test's negative control: a store whose script is
//! wrong must be found, and its divergence shrunk.

use super::{Leeway, budget, explore};
use crate::support::{Backend, TestStore};

/// The newest definition of PostgreSQL's claim function among the
/// migrations (the one the store calls), as `CREATE OR REPLACE`.
fn newest_claim() -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the migrations")
        .map(|entry| entry.expect("a migration").path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    let newest = files
        .iter()
        .rev()
        .map(|path| std::fs::read_to_string(path).expect("a migration"))
        .find_map(|sql| {
            let at = sql.rfind("FUNCTION idemgate_claim(")?;
            let start = sql[..at].rfind("CREATE")?;
            let end = at + sql[at..].find("\n$$;")? + 4;
            Some(sql[start..end].to_string())
        })
        .expect("a migration defines idemgate_claim");
    let body = newest
        .find("FUNCTION idemgate_claim(")
        .expect("found above");
    format!("CREATE OR REPLACE {}", &newest[body..])
}

/// The negative control: the PostgreSQL claim with its fingerprint check
/// after its replay (a completed key replayed to another request), in
/// this test's database only, must be found and shrunk to the few steps
/// that show it.
#[tokio::test]
async fn a_misordered_claim_is_found() {
    let storage = TestStore::new(Backend::Postgres).await;
    let store = storage.open().await;
    let claim = newest_claim();
    let mismatch = "        IF r.fingerprint <> p_fingerprint THEN
            RETURN QUERY SELECT 'mismatch'::TEXT, NULL::BIGINT, NULL::BIGINT, NULL::TEXT,
                                NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
            RETURN;
        END IF;

";
    let replay = "        IF r.state = 'completed' THEN
            RETURN QUERY SELECT 'replay'::TEXT, r.token, NULL::BIGINT, NULL::TEXT,
                                r.status, r.headers, r.body;
            RETURN;
        END IF;

";
    let in_order = format!("{mismatch}{replay}");
    assert!(
        claim.contains(&in_order),
        "the claim's checks moved: update the control"
    );
    let misordered = claim.replacen(&in_order, &format!("{replay}{mismatch}"), 1);
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&storage.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(misordered))
        .execute(&mut conn)
        .await
        .expect("the misordered copy replaces the claim");
    let (_, seed) = budget();
    let Err((reason, case)) = explore(store, 256, seed, Leeway::of(Backend::Postgres)).await else {
        panic!("a claim that replays to another request went unnoticed");
    };
    println!("the negative control's divergence:\n{reason}\nshortest case found:\n{case:?}");
    assert!(reason.contains("Mismatch"), "{reason}");
    assert!(case.ops.len() <= 6, "not shrunk: {case:?}");
}
