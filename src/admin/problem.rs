//! The admin listener's refusals and errors as RFC 9457
//! `application/problem+json`, like the proxy's own answers
//! ([`crate::problem`]) but with their own types
//! (`urn:idemgate:problem:admin-<slug>`), listed in the OpenAPI document
//! (docs/src/reference/openapi.json, `AdminProblem`).

use http::{Response, StatusCode};

use super::keys::KeysError;
use crate::request::body::Body;

/// Every kind of problem the admin listener answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminProblem {
    /// A missing or wrong admin token.
    Unauthorized,
    /// No `admin_token` is configured: the operation is off.
    Off,
    /// No admin endpoint at that path.
    NoEndpoint,
    /// The endpoint exists, not with that method.
    MethodNotAllowed,
    /// The `POST /keys` body is unreadable or not a keys command.
    BadCommand,
    /// The `POST /keys` body is larger than the limit.
    CommandTooLarge,
    /// No record for that key.
    NoRecord,
    /// The command names an unknown route, a scope the route does not
    /// take, an invalid key or the wrong number of key parts.
    BadTarget,
    /// The record is busy (a live lease, an inquiry inside `after`),
    /// completed (for a release) or changed meanwhile.
    Conflict,
    /// The store failed.
    StoreUnavailable,
}

impl AdminProblem {
    /// Every kind, for the document's drift test.
    pub const ALL: [Self; 10] = [
        Self::Unauthorized,
        Self::Off,
        Self::NoEndpoint,
        Self::MethodNotAllowed,
        Self::BadCommand,
        Self::CommandTooLarge,
        Self::NoRecord,
        Self::BadTarget,
        Self::Conflict,
        Self::StoreUnavailable,
    ];

    /// Its status, slug (after `urn:idemgate:problem:`) and title.
    pub fn kind(self) -> (StatusCode, &'static str, &'static str) {
        use StatusCode as S;
        match self {
            Self::Unauthorized => (
                S::UNAUTHORIZED,
                "admin-unauthorized",
                "Admin token required",
            ),
            Self::Off => (S::FORBIDDEN, "admin-off", "Admin operation off"),
            Self::NoEndpoint => (S::NOT_FOUND, "admin-no-endpoint", "No such admin endpoint"),
            Self::MethodNotAllowed => (
                S::METHOD_NOT_ALLOWED,
                "admin-method-not-allowed",
                "Method not allowed",
            ),
            Self::BadCommand => (S::BAD_REQUEST, "admin-bad-command", "Not a keys command"),
            Self::CommandTooLarge => (
                S::PAYLOAD_TOO_LARGE,
                "admin-command-too-large",
                "Keys command too large",
            ),
            Self::NoRecord => (S::NOT_FOUND, "admin-no-record", "No record for this key"),
            Self::BadTarget => (S::BAD_REQUEST, "admin-bad-target", "No such key target"),
            Self::Conflict => (S::CONFLICT, "admin-conflict", "Key not removed"),
            Self::StoreUnavailable => (
                S::SERVICE_UNAVAILABLE,
                "admin-store-unavailable",
                "Store unavailable",
            ),
        }
    }

    /// The kind of a failed keys command.
    pub fn of_keys(error: &KeysError) -> Self {
        use KeysError as E;
        match error {
            E::NotFound { .. } | E::Absent(_) => Self::NoRecord,
            E::NoRoute(_)
            | E::NoScope(_)
            | E::InvalidKey(_)
            | E::KeyParts { .. }
            | E::EraseTarget
            | E::BadDigest
            | E::NoScopedRoute(..) => Self::BadTarget,
            E::LiveLease { .. } | E::InsideAfter { .. } | E::Completed(_) | E::Changed { .. } => {
                Self::Conflict
            }
            E::Store(_) | E::Admin(_) | E::EraseFailed { .. } => Self::StoreUnavailable,
        }
    }

    /// The answer: `detail` says what was wrong and what to do.
    pub fn to_response(self, detail: impl Into<String>) -> Response<Body> {
        let (status, slug, title) = self.kind();
        crate::problem::render(status, slug, title, detail.into().trim_end())
    }
}

/// The `detail` of a problem+json body, if `body` is one (the CLI shows it
/// rather than the JSON).
pub fn detail_of(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Detail {
        detail: String,
    }
    serde_json::from_slice::<Detail>(body)
        .ok()
        .map(|d| d.detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_problem_names_its_type_and_says_what_to_do() {
        let r = AdminProblem::Conflict.to_response("key \"k\" is in flight\n");
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "urn:idemgate:problem:admin-conflict");
        assert_eq!(v["status"], 409);
        assert_eq!(v["detail"], "key \"k\" is in flight");
        assert_eq!(detail_of(&body).as_deref(), Some("key \"k\" is in flight"));
        assert_eq!(detail_of(b"plain text"), None);
    }

    #[test]
    fn slugs_are_distinct() {
        let mut slugs: Vec<_> = AdminProblem::ALL.iter().map(|p| p.kind().1).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), AdminProblem::ALL.len());
    }
}
