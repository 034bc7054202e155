//! The divergences the generated cases found, each shrunk and fixed, run
//! on every store as they were found (docs/src/design/state-machine.md,
//! "What it found").

use super::ops::{Case, Key, Op, Pick};
use super::{Leeway, run_case};
use crate::support::{Backend, TestStore, per_backend};

/// The divergences the generated cases found, shrunk, kept as they were
/// found (docs/src/design/state-machine.md).
fn found() -> Vec<(&'static str, Case)> {
    use idemgate::config::UnknownOutcome::{Hold, Inquire, Release};
    let claim = |lease, retention| Op::Claim {
        key: Key::A,
        fingerprint: 0,
        lease,
        retention,
    };
    let case = |policy, ops| Case {
        policy,
        after: 0,
        retention: 1,
        ops,
    };
    vec![
        (
            "a write revived a record past its retention (PostgreSQL, SQLite, memory, front)",
            case(
                Hold,
                vec![
                    claim(1, 1),
                    Op::Age { tens: 6 },
                    Op::Renew {
                        key: Key::A,
                        token: Pick::Newest,
                        lease: 1,
                    },
                ],
            ),
        ),
        (
            "a record expired under a live lease longer than its retention (Redis)",
            case(Hold, vec![claim(2, 1), Op::Age { tens: 6 }]),
        ),
        (
            "a question due now was due in 1 ms (Redis)",
            case(
                Release,
                vec![
                    claim(1, 1),
                    Op::Inquire {
                        key: Key::A,
                        token: Pick::Newest,
                        next: 0,
                        asked: true,
                        retention: 2,
                    },
                    claim(1, 1),
                ],
            ),
        ),
        (
            "a lease renewed shorter was asked about only at its old end (Redis)",
            case(
                Inquire,
                vec![
                    claim(2, 2),
                    Op::Renew {
                        key: Key::A,
                        token: Pick::Newest,
                        lease: 1,
                    },
                    Op::Age { tens: 6 },
                    Op::Take { lease: 1 },
                ],
            ),
        ),
    ]
}

pub(super) async fn the_divergences_found_stay_fixed(b: Backend) {
    let storage = TestStore::new(b).await;
    let store = storage.open().await;
    for (n, (what, case)) in found().into_iter().enumerate() {
        if let Err(e) = run_case(store.as_ref(), n as u64, &case, Leeway::of(b)).await {
            panic!("{} store: {what}, again:\n{e}\n{case:?}", b.name());
        }
    }
}

per_backend!(
    only [postgres, redis, redis_cluster, sqlite, memory, front]:
    the_divergences_found_stay_fixed,
);
