//! The admin API's contract (`GET /openapi.json`): served open by a
//! running gateway, the same document as in the repository, and the
//! admin listener's refusals are the problem+json it promises. (The whole
//! contract is checked against a running gateway by
//! tests/contract/schemathesis.sh.)

use http::StatusCode;
use serde_json::Value;

use crate::support::{Backend, Setup, send};

#[tokio::test]
async fn the_admin_listener_serves_its_openapi_document() {
    let setup = Setup::start(Backend::Memory).await;
    let (admin, c) = (setup.gateway.admin, &setup.client);
    let served = send(c, "GET", &format!("http://{admin}/openapi.json"), &[], "").await;
    assert_eq!(served.status, StatusCode::OK);
    assert_eq!(served.header("content-type"), Some("application/json"));
    let doc: Value = serde_json::from_slice(&served.body).expect("JSON");
    let shipped: Value =
        serde_json::from_str(include_str!("../../../docs/src/reference/openapi.json")).unwrap();
    assert_eq!(doc, shipped, "the served document is the repository's");
    assert_eq!(doc["openapi"], "3.1.0");
    for path in ["/metrics", "/healthz", "/readyz", "/openapi.json", "/keys"] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }

    // What it says of refusals holds: a method the path does not answer
    // is 405 with Allow, an unknown path 404, both problem+json.
    let wrong = send(c, "DELETE", &format!("http://{admin}/keys"), &[], "").await;
    assert_eq!(wrong.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong.header("allow"), Some("POST"));
    assert_eq!(
        wrong.header("content-type"),
        Some("application/problem+json")
    );
    let problem: Value = serde_json::from_slice(&wrong.body).unwrap();
    assert_eq!(
        problem["type"],
        "urn:idemgate:problem:admin-method-not-allowed"
    );
    let nowhere = send(c, "GET", &format!("http://{admin}/nowhere"), &[], "").await;
    assert_eq!(nowhere.status, StatusCode::NOT_FOUND);
    let problem: Value = serde_json::from_slice(&nowhere.body).unwrap();
    assert_eq!(problem["type"], "urn:idemgate:problem:admin-no-endpoint");
    assert_eq!(problem["status"], 404);
}
