//! Redis under Sentinel:
//! `redis+sentinel://[user:password@]s1:26379,s2:26379,s3:26379/mymaster?db=0`
//! (`rediss+sentinel://`: TLS to the sentinels and to Redis).
//!
//! Each time the store opens a connection, every sentinel is asked at once
//! for `mymaster`'s address (`SENTINEL get-master-addr-by-name`), and the
//! address a majority of the sentinels the URL lists name is the primary,
//! once it says so itself (`ROLE`). A sentinel that has not yet learned of
//! a failover is outvoted, so the gateway never follows it to a server
//! that came back empty and still calls itself a primary; without a
//! majority, opening the connection fails (closed). The store opens one
//! whenever a connection failed or a write met `READONLY` (a primary
//! demoted to replica), so after a failover every lane finds the new
//! primary on its next operation. The user and password are the Redis
//! servers'; the sentinels are reached without them.

use std::time::Duration;

use deadpool_redis::redis::{self, AsyncConnectionConfig, ErrorKind, RedisResult, Value};
use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// The sentinels' port when the URL names none.
const SENTINEL_PORT: u16 = 26379;

/// The sentinels of one primary, asked for it when a connection is opened.
pub(super) struct Sentinels {
    /// One client per sentinel the URL lists.
    sentinels: Vec<redis::Client>,
    /// The name the sentinels know the primary by.
    name: String,
    /// A primary's URL around its `host:port`: `redis[s]://[user:pass@]`
    /// and `/db`.
    node: (String, String),
    /// Each question to a sentinel, and the primary's `ROLE`.
    settings: AsyncConnectionConfig,
    timeout: Duration,
}

/// A `redis+sentinel://` URL taken apart.
#[derive(Debug, PartialEq)]
struct SentinelUrl {
    tls: bool,
    sentinels: Vec<(String, u16)>,
    primary: String,
    db: i64,
    username: Option<String>,
    password: Option<String>,
}

/// `host` as a URL writes it (an IPv6 address in brackets).
fn url_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

impl Sentinels {
    /// The sentinels `url` names, each asked within half of `timeout` (the
    /// primary's `ROLE` takes the other half); the error says what is
    /// wrong with the URL.
    pub(super) fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let parsed = parse(url)?;
        let scheme = if parsed.tls { "rediss" } else { "redis" };
        let sentinels = parsed
            .sentinels
            .iter()
            .map(|(host, port)| {
                super::tcp::client(format!("{scheme}://{}:{port}/", url_host(host)))
            })
            .collect::<RedisResult<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        let encode = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
        let userinfo = match (&parsed.username, &parsed.password) {
            (None, None) => String::new(),
            (user, password) => format!(
                "{}:{}@",
                user.as_deref().map(encode).unwrap_or_default(),
                password.as_deref().map(encode).unwrap_or_default()
            ),
        };
        let half = timeout / 2;
        Ok(Self {
            sentinels,
            name: parsed.primary,
            node: (format!("{scheme}://{userinfo}"), format!("/{}", parsed.db)),
            settings: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(half))
                .set_response_timeout(Some(half)),
            timeout: half,
        })
    }

    /// A client for the primary a majority of the sentinels name now.
    pub(super) async fn primary(&self) -> RedisResult<redis::Client> {
        let asks = self.sentinels.iter().map(|sentinel| self.ask(sentinel));
        let named: Vec<(String, u16)> = futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect();
        let Some((host, port)) = majority(&named, self.sentinels.len()) else {
            return Err(redis::RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no majority of the sentinels names one primary",
                format!(
                    "{} of {} answered: {named:?}",
                    named.len(),
                    self.sentinels.len()
                ),
            )));
        };
        let client = super::tcp::client(format!(
            "{}{}:{port}{}",
            self.node.0,
            url_host(&host),
            self.node.1
        ))?;
        let role = tokio::time::timeout(self.timeout, async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&self.settings)
                .await?;
            redis::cmd("ROLE")
                .query_async::<Vec<Value>>(&mut conn)
                .await
        })
        .await
        .map_err(|_| {
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
        })??;
        match role.first() {
            Some(Value::BulkString(role)) if role == b"master" => Ok(client),
            _ => Err(redis::RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "the server the sentinels name is not a primary (yet)",
                format!("{host}:{port}"),
            ))),
        }
    }

    /// What one sentinel names as the primary; `None` if it does not
    /// answer in time or names none.
    async fn ask(&self, sentinel: &redis::Client) -> Option<(String, u16)> {
        let answer = tokio::time::timeout(self.timeout, async {
            let mut conn = sentinel
                .get_multiplexed_async_connection_with_config(&self.settings)
                .await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.name)
                .query_async::<Option<(String, String)>>(&mut conn)
                .await
        })
        .await;
        let (host, port) = answer.ok()?.ok()??;
        Some((host, port.parse().ok()?))
    }
}

/// The address more than half of `listed` sentinels named, if one was.
fn majority(named: &[(String, u16)], listed: usize) -> Option<(String, u16)> {
    named
        .iter()
        .find(|candidate| named.iter().filter(|n| n == candidate).count() * 2 > listed)
        .cloned()
}

/// Take a `redis+sentinel://` URL apart.
fn parse(url: &str) -> Result<SentinelUrl, String> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        (false, rest)
    } else {
        return Err("a Sentinel URL starts with redis+sentinel:// or rediss+sentinel://".into());
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hostlist) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let decode = |s: &str| {
        percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| "the user or password is not UTF-8 once percent-decoded".to_string())
    };
    let (username, password) = match userinfo.map(|u| u.split_once(':').unwrap_or((u, ""))) {
        None => (None, None),
        Some((user, password)) => (
            Some(decode(user)?).filter(|u| !u.is_empty()),
            Some(decode(password)?).filter(|p| !p.is_empty()),
        ),
    };
    let sentinels = hostlist
        .split(',')
        .map(sentinel_addr)
        .collect::<Result<Vec<_>, _>>()?;
    let primary = path.trim_end_matches('/');
    if primary.is_empty() || primary.contains('/') {
        return Err(
            "name the primary Sentinel monitors in the path: redis+sentinel://s1:26379,s2:26379/mymaster"
                .into(),
        );
    }
    let mut db = 0;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("db", n)) => {
                db = n
                    .parse()
                    .map_err(|_| format!("db={n} is not a database number"))?;
            }
            _ => return Err(format!("unknown parameter {pair:?} (only db=N)")),
        }
    }
    Ok(SentinelUrl {
        tls,
        sentinels,
        primary: decode(primary)?,
        db,
        username,
        password,
    })
}

/// `host`, `host:port` or `[v6]:port`.
fn sentinel_addr(host: &str) -> Result<(String, u16), String> {
    if host.is_empty() {
        return Err("an empty sentinel in the list (write s1:26379,s2:26379)".into());
    }
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && !port.contains(']') => (
            name,
            port.parse()
                .map_err(|_| format!("{host}: {port} is not a port"))?,
        ),
        _ => (host, SENTINEL_PORT),
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    Ok((name.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sentinels_primary_db_and_credentials() {
        let url =
            parse("redis+sentinel://app:p%40ss@s1:26379,s2,[::1]:26380/mymaster?db=3").unwrap();
        assert_eq!(
            url,
            SentinelUrl {
                tls: false,
                sentinels: vec![
                    ("s1".into(), 26379),
                    ("s2".into(), SENTINEL_PORT),
                    ("::1".into(), 26380)
                ],
                primary: "mymaster".into(),
                db: 3,
                username: Some("app".into()),
                password: Some("p@ss".into()),
            }
        );
        let tls = parse("rediss+sentinel://:secret@s1/m/").unwrap();
        assert!(tls.tls);
        assert_eq!((tls.username, tls.password), (None, Some("secret".into())));
        assert_eq!(tls.primary, "m");
    }

    #[test]
    fn says_what_is_wrong() {
        for (url, says) in [
            ("redis+sentinel://s1,s2", "name the primary"),
            ("redis+sentinel://s1,,s2/m", "empty sentinel"),
            ("redis+sentinel://s1:x/m", "not a port"),
            ("redis+sentinel://s1/m?db=x", "not a database"),
            ("redis+sentinel://s1/m?timeout=1", "unknown parameter"),
            ("redis://s1/m", "starts with"),
        ] {
            let error = parse(url).unwrap_err();
            assert!(error.contains(says), "{url}: {error}");
        }
    }

    #[test]
    fn the_primary_is_what_a_majority_of_the_listed_sentinels_name() {
        let a = ("10.0.0.1".to_string(), 6379);
        let b = ("10.0.0.2".to_string(), 6379);
        assert_eq!(
            majority(&[a.clone(), a.clone(), b.clone()], 3),
            Some(a.clone())
        );
        // One sentinel down: the two others agree.
        assert_eq!(majority(&[b.clone(), b.clone()], 3), Some(b.clone()));
        // A lagging sentinel against a new one, the third down: nobody.
        assert_eq!(majority(&[a.clone(), b.clone()], 3), None);
        // Only one of three answers: not a majority of those listed.
        assert_eq!(majority(std::slice::from_ref(&a), 3), None);
        assert_eq!(majority(std::slice::from_ref(&a), 1), Some(a.clone()));
        assert_eq!(majority(&[], 3), None);
    }
}
