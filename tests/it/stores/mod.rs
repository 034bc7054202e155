//! The stores, each on its own: the one conformance suite every store runs
//! (`conformance`, and `inquiry` for the status inquiry's states), every
//! store against the core's rules on generated cases (`differential`), and what
//! only one store does: SQLite as a user runs it; the PostgreSQL front on
//! Redis (`front`); the Redis store on a Redis Cluster (with replicas,
//! failed over), its lost records reported, its eviction warning, its claims that arrive late, its replicas (`WAIT`) and Sentinel, its index of records by scope, its
//! status questions moved out of an earlier release's one due set; PostgreSQL's batched claims, races, generations,
//! sweep plan, upgrade in place and failover to a standby; the replay
//! cache in front of the shared stores; and sealed records on every store
//! (`sealed`: no response byte in the store, rotation, copies refused). The guarantees on every store are
//! in `guarantees/`.

mod conformance;
mod differential;
mod front;
mod inquiry;
mod postgres_batches;
mod postgres_failover;
mod postgres_generations;
mod postgres_plans;
mod postgres_races;
mod postgres_shedding;
mod postgres_upgrade;
mod redis_cluster;
mod redis_cluster_replicas;
mod redis_dataset;
mod redis_eviction;
mod redis_inquiry_upgrade;
mod redis_late_claims;
mod redis_replicas;
mod redis_scope_index;
mod redis_sentinel;
mod replay_cache;
mod sealed;
mod sqlite;
