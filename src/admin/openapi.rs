//! The admin API's contract: the OpenAPI 3.1 document
//! (docs/src/reference/openapi.json), built into the binary and served
//! open at `GET /openapi.json`. It also lists the proxy's problem types
//! (`ProxyProblem`) and the admin listener's (`AdminProblem`); the tests
//! below keep both lists equal to what the code answers with, and
//! tests/contract/schemathesis.sh checks the rest against a running gateway.

use http::{HeaderValue, Response, StatusCode, header};

use crate::request::body::{Body, full};

/// The document, as in the repository.
pub const DOCUMENT: &str = include_str!("../../docs/src/reference/openapi.json");

/// `GET /openapi.json`.
pub fn response() -> Response<Body> {
    let mut response = Response::new(full(DOCUMENT));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::DOCUMENT;
    use crate::admin::problem::AdminProblem;

    const URN: &str = "urn:idemgate:problem:";

    /// The (slug, status) pairs a problem schema's `oneOf` lists.
    fn listed(doc: &Value, schema: &str) -> BTreeSet<(String, u16)> {
        let all_of = doc["components"]["schemas"][schema]["allOf"]
            .as_array()
            .unwrap_or_else(|| panic!("{schema} has no allOf"));
        let kinds = all_of
            .iter()
            .find_map(|part| part["oneOf"].as_array())
            .unwrap_or_else(|| panic!("{schema} lists no oneOf"));
        kinds
            .iter()
            .map(|kind| {
                let urn = kind["properties"]["type"]["const"].as_str().unwrap();
                let status = kind["properties"]["status"]["const"].as_u64().unwrap();
                let slug = urn.strip_prefix(URN).expect("an idemgate problem type");
                (slug.to_string(), u16::try_from(status).unwrap())
            })
            .collect()
    }

    /// The (slug, status) pairs src/problem.rs answers with, read from its
    /// source: every `S::STATUS, "slug"` of its one mapping, so a type
    /// added there anywhere (a new variant, a new arm) is seen.
    fn produced(source: &str) -> BTreeSet<(String, u16)> {
        let flat: String = source.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut found = BTreeSet::new();
        for piece in flat.split("S::").skip(1) {
            let Some((name, rest)) = piece.split_once(", \"") else {
                continue;
            };
            let Some((slug, _)) = rest.split_once('"') else {
                continue;
            };
            if !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                continue;
            }
            found.insert((slug.to_string(), status_named(name)));
        }
        found
    }

    /// The code of `http::StatusCode::NAME`, found by its reason phrase.
    fn status_named(name: &str) -> u16 {
        (100..600)
            .find(|&code| {
                http::StatusCode::from_u16(code)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .is_some_and(|r| r.to_uppercase().replace([' ', '-'], "_") == name)
            })
            .unwrap_or_else(|| panic!("no status named {name}"))
    }

    fn document() -> Value {
        serde_json::from_str(DOCUMENT).expect("the document is JSON")
    }

    #[test]
    fn the_document_lists_exactly_the_proxy_problems() {
        let produced = produced(include_str!("../problem.rs"));
        assert!(produced.len() >= 20, "the scan found too few: {produced:?}");
        assert_eq!(
            listed(&document(), "ProxyProblem"),
            produced,
            "docs/src/reference/openapi.json (ProxyProblem) and src/problem.rs disagree"
        );
    }

    #[test]
    fn the_document_lists_exactly_the_admin_problems() {
        let answered: BTreeSet<_> = AdminProblem::ALL
            .iter()
            .map(|p| {
                let (status, slug, _) = p.kind();
                (slug.to_string(), status.as_u16())
            })
            .collect();
        assert_eq!(listed(&document(), "AdminProblem"), answered);
    }

    /// The checks above fail when either side changes alone.
    #[test]
    fn a_drift_is_caught() {
        let source = include_str!("../problem.rs");
        let added = format!("{source}\n    E::Gone => k(S::GONE, \"brand-new\", \"New\"),");
        assert!(produced(&added).contains(&("brand-new".to_string(), 410)));
        assert_ne!(produced(&added), listed(&document(), "ProxyProblem"));
        let moved = DOCUMENT.replacen("\"const\": 422", "\"const\": 400", 1);
        let moved: Value = serde_json::from_str(&moved).unwrap();
        assert_ne!(listed(&moved, "ProxyProblem"), produced(source));
    }

    /// The document admits the scope digests the server accepts.
    #[test]
    fn the_scope_digest_pattern_is_the_servers() {
        let digest =
            &document()["components"]["schemas"]["EraseTarget"]["properties"]["scope_digest"];
        assert_eq!(
            digest["pattern"],
            crate::admin::keys::SCOPE_DIGEST_PATTERN,
            "docs/src/reference/openapi.json (EraseTarget.scope_digest) and src/admin/keys.rs disagree"
        );
    }

    /// The properties of `schema`, by name.
    fn properties(doc: &Value, schema: &str) -> BTreeSet<String> {
        doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{schema} has no properties"))
            .keys()
            .cloned()
            .collect()
    }

    /// `keys show --json` prints exactly the properties RecordInfo lists
    /// (every optional one present here), and its reasons for a sealed
    /// record that does not open are the listed ones.
    #[test]
    fn the_record_info_schema_is_what_keys_show_prints() {
        use crate::store::{RecordInfo, RecordState, seal::OpenError};
        let now = std::time::SystemTime::now();
        let every = RecordInfo {
            route: "r".into(),
            scope: String::new(),
            key: "k".into(),
            state: RecordState::Completed,
            held_reason: None,
            token: 1,
            created_at: now,
            updated_at: now,
            expires_at: now,
            lease_until: None,
            inquiries: Some(1),
            inquiring_since: Some(now),
            status: None,
            body_bytes: None,
            sealed_with: Some("k1".into()),
            opened: Some(false),
            open_error: Some("unknown_key"),
        };
        let printed: BTreeSet<String> = serde_json::to_value(&every)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let doc = document();
        assert_eq!(
            printed,
            properties(&doc, "RecordInfo"),
            "docs/src/reference/openapi.json (RecordInfo) and RecordInfo disagree"
        );
        let listed: BTreeSet<&str> =
            doc["components"]["schemas"]["RecordInfo"]["properties"]["open_error"]["enum"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
        let reasons: BTreeSet<&str> = [
            OpenError::UnknownKey(String::new()),
            OpenError::Unauthentic(String::new()),
        ]
        .iter()
        .map(OpenError::reason)
        .collect();
        assert_eq!(listed, reasons);
    }

    #[test]
    fn the_document_is_openapi_3_1_with_every_endpoint() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths: BTreeSet<_> = doc["paths"].as_object().unwrap().keys().cloned().collect();
        let served: BTreeSet<_> = super::super::ENDPOINTS
            .iter()
            .map(|(path, _)| path.to_string())
            .collect();
        assert_eq!(paths, served);
        for (path, allow) in super::super::ENDPOINTS {
            let methods: Vec<_> = doc["paths"][path]
                .as_object()
                .unwrap()
                .keys()
                .map(|m| m.to_uppercase())
                .collect();
            assert_eq!(methods.join(", "), allow, "{path}");
        }
    }
}
