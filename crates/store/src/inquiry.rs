//! What a store needs to know of the status inquiry
//! (docs/src/guide/status-inquiry.md): the routes an instance asks for, and
//! the questions it takes ([`super::StoreAdmin::take_inquiries`]).

use std::time::Duration;

use super::{RecordKey, Token};

/// A key whose outcome is being asked about, taken by one instance
/// ([`super::StoreAdmin::take_inquiries`]): it holds `token` until it settles the
/// key with a write of the request path, or until its lease lapses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inquiry {
    /// The key.
    pub key: RecordKey,
    /// The token this inquirer's writes carry.
    pub token: Token,
    /// Questions asked before this one.
    pub asked: u32,
    /// How long the key has been inquiring.
    pub inquiring_for: Duration,
}

/// A route whose unknown outcomes are asked about, as the store needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InquiringRoute {
    /// The route's name.
    pub name: String,
    /// Its records' retention.
    pub retention: Duration,
    /// Its `[routes.inquiry] after`: an in-flight record whose lease lapsed
    /// is taken only this long past the lapse
    /// ([`super::transitions::take_applies`]).
    pub after: Duration,
}

impl InquiringRoute {
    /// The retention of the route named `name` among `routes`, if it is one.
    pub fn retention_of(routes: &[Self], name: &str) -> Option<Duration> {
        routes.iter().find(|r| r.name == name).map(|r| r.retention)
    }

    /// The `after` of the route named `name` among `routes`, if it is one.
    pub fn after_of(routes: &[Self], name: &str) -> Option<Duration> {
        routes.iter().find(|r| r.name == name).map(|r| r.after)
    }
}
