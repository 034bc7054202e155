//! The Redis store's two kinds of connection behind one type: a multiplexed
//! connection to a single server, or a cluster connection (the redis
//! crate's `cluster_async`, which routes each command to the primary of its
//! key's slot and follows `MOVED`/`ASK`). Scripts and commands run on
//! either through [`redis::aio::ConnectionLike`]; [`Conn::query_node`]
//! sends a command to one named node of a cluster (`SCAN`, `CLUSTER INFO`).

use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use deadpool_redis::redis::{self, Cmd, FromRedisValue, Pipeline, RedisFuture, Value};

/// A connection to a single server or to a cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    /// `cluster = false`.
    Single(MultiplexedConnection),
    /// `cluster = true`.
    Cluster(ClusterConnection),
}

/// A cluster node's address, as `CLUSTER SLOTS` names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Node {
    pub(super) host: String,
    pub(super) port: u16,
}

impl Conn {
    /// Run `cmd` on `node` (a cluster's), or on the one server.
    pub(super) async fn query_node<T: FromRedisValue>(
        &mut self,
        cmd: Cmd,
        node: Option<&Node>,
    ) -> redis::RedisResult<T> {
        match (self, node) {
            (Conn::Cluster(conn), Some(node)) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: node.host.clone(),
                    port: node.port,
                });
                let value = conn.route_command(cmd, routing).await?;
                Ok(T::from_redis_value(value)?)
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }
}

/// The primaries named by a `CLUSTER SLOTS` reply (each slot range:
/// start, end, primary, replicas…; a node: host, port, id…), each once.
pub(super) fn primaries(slots: &Value) -> Vec<Node> {
    let mut nodes = Vec::new();
    let Value::Array(ranges) = slots else {
        return nodes;
    };
    for range in ranges {
        let Value::Array(range) = range else { continue };
        let Some(Value::Array(primary)) = range.get(2) else {
            continue;
        };
        let host = match primary.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            continue;
        };
        if let Ok(port) = u16::try_from(*port) {
            nodes.push(Node { host, port });
        }
    }
    nodes.sort();
    nodes.dedup();
    nodes
}

/// `url` (`redis://[user:pass@]host:port[/…]`) with `node`'s host and port.
pub(super) fn url_of(url: &str, node: &Node) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let credentials = authority.rsplit_once('@').map(|(c, _)| c);
    let host = if node.host.contains(':') {
        format!("[{}]", node.host)
    } else {
        node.host.clone()
    };
    match credentials {
        Some(c) => format!("{scheme}://{c}@{host}:{}{tail}", node.port),
        None => format!("{scheme}://{host}:{}{tail}", node.port),
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: u16) -> Node {
        Node {
            host: host.to_string(),
            port,
        }
    }

    #[test]
    fn a_node_url_keeps_scheme_credentials_and_path() {
        let n = node("10.0.0.2", 7001);
        assert_eq!(url_of("redis://h:7000", &n), "redis://10.0.0.2:7001");
        assert_eq!(
            url_of("rediss://u:p@h:7000/0?x=1", &n),
            "rediss://u:p@10.0.0.2:7001/0?x=1"
        );
        assert_eq!(
            url_of("redis://h", &node("::1", 7002)),
            "redis://[::1]:7002"
        );
    }

    #[test]
    fn primaries_are_read_from_cluster_slots() {
        let n = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |start, primary, replica| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(start + 1),
                primary,
                replica,
            ])
        };
        let reply = Value::Array(vec![
            range(0, n("127.0.0.1", 7001), n("127.0.0.1", 7004)),
            range(2, n("127.0.0.1", 7000), n("127.0.0.1", 7003)),
            range(4, n("127.0.0.1", 7001), n("127.0.0.1", 7004)),
        ]);
        assert_eq!(
            primaries(&reply),
            vec![node("127.0.0.1", 7000), node("127.0.0.1", 7001)]
        );
        assert!(primaries(&Value::Nil).is_empty());
    }
}
