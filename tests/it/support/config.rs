//! Gateway configurations for tests, built and edited as TOML tables (never
//! as text): [`TestConfig::new`] is one gateway in front of one upstream,
//! and each test changes what it needs, e.g.
//!
//! ```ignore
//! store.config(&upstream.url()).route(|r| {
//!     r.set("lease", "1s").set("on_unknown_outcome", "release");
//! })
//! ```

use std::fmt;

use toml::{Table, Value};

/// Insert or replace one key of a TOML table.
pub trait Set {
    fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Self;
}

impl Set for Table {
    fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        self.insert(key.to_string(), value.into());
        self
    }
}

/// A whole gateway configuration; `to_string()` gives the file's text.
#[derive(Debug, Clone)]
pub struct TestConfig {
    table: Table,
}

impl TestConfig {
    /// One gateway on `store_url`, both listeners on port 0, with a short
    /// store timeout (1 s) and, in `[defaults]`, a short `lease` (3 s) and
    /// `upstream_timeout` (2 s); one route, `api`, sends `/v1/*` to
    /// `upstream`.
    pub fn new(store_url: &str, upstream: &str) -> Self {
        let mut table = Table::new();
        table
            .set("listen", "127.0.0.1:0")
            .set("admin_listen", "127.0.0.1:0")
            .set("shutdown_timeout", "10s");
        let mut store = Table::new();
        store.set("url", store_url).set("timeout", "1s");
        let mut defaults = Table::new();
        defaults.set("lease", "3s").set("upstream_timeout", "2s");
        let mut api = Table::new();
        api.set("name", "api")
            .set("match", "/v1/*")
            .set("upstream", upstream);
        table
            .set("store", store)
            .set("defaults", defaults)
            .set("routes", vec![Value::Table(api)]);
        Self { table }
    }

    /// Edit the top level (`listen`, `log_format`, `max_connections`, …).
    pub fn top(mut self, edit: impl FnOnce(&mut Table)) -> Self {
        edit(&mut self.table);
        self
    }

    /// Edit `[store]`.
    pub fn store(self, edit: impl FnOnce(&mut Table)) -> Self {
        self.section("store", edit)
    }

    /// Edit `[defaults]`.
    pub fn defaults(self, edit: impl FnOnce(&mut Table)) -> Self {
        self.section("defaults", edit)
    }

    /// Edit the first `[[routes]]` entry (the `api` route).
    pub fn route(self, edit: impl FnOnce(&mut Table)) -> Self {
        self.routes(|routes| {
            edit(
                routes
                    .first_mut()
                    .and_then(Value::as_table_mut)
                    .expect("a route"),
            )
        })
    }

    /// Edit the `[[routes]]` array itself.
    pub fn routes(mut self, edit: impl FnOnce(&mut Vec<Value>)) -> Self {
        let routes = self
            .table
            .get_mut("routes")
            .and_then(Value::as_array_mut)
            .expect("[[routes]]");
        edit(routes);
        self
    }

    /// The listeners on these ports of 127.0.0.1.
    pub fn with_ports(self, port: u16, admin_port: u16) -> Self {
        self.top(|t| {
            t.set("listen", format!("127.0.0.1:{port}"))
                .set("admin_listen", format!("127.0.0.1:{admin_port}"));
        })
    }

    fn section(mut self, name: &str, edit: impl FnOnce(&mut Table)) -> Self {
        let section = self
            .table
            .entry(name)
            .or_insert_with(|| Value::Table(Table::new()));
        edit(section.as_table_mut().expect("a table"));
        self
    }
}

impl fmt::Display for TestConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&toml::to_string(&self.table).map_err(|_| fmt::Error)?)
    }
}
