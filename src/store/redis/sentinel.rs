//! Redis under Sentinel:
//! `redis+sentinel://[user:password@]s1:26379,s2:26379,s3:26379/mymaster?db=0`
//! (`rediss+sentinel://`: TLS to the sentinels and to Redis).
//!
//! The sentinels are asked for `mymaster`'s primary each time the store
//! opens a connection (the redis crate's Sentinel client, which also checks
//! that the server it names says it is a primary). The store opens one
//! whenever a connection failed or a write met `READONLY` (a primary
//! demoted to replica), so after a failover every lane finds the new
//! primary on its next operation. The user and password are the Redis
//! servers'; the sentinels are reached without them.

use deadpool_redis::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use deadpool_redis::redis::{self, ConnectionAddr, TlsMode};
use percent_encoding::percent_decode_str;

/// The sentinels' port when the URL names none.
const SENTINEL_PORT: u16 = 26379;

/// The sentinels of one primary, asked for it when a connection is opened.
pub(super) struct Sentinels {
    client: tokio::sync::Mutex<SentinelClient>,
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels").finish_non_exhaustive()
    }
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

/// Whether `url` names Redis through Sentinel.
pub(in crate::store) fn is_sentinel_url(url: &str) -> bool {
    url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
}

impl Sentinels {
    /// The sentinels `url` names; the error says what is wrong with it.
    pub(super) fn new(url: &str) -> Result<Self, String> {
        let parsed = parse(url)?;
        let addr = |(host, port): &(String, u16)| {
            if parsed.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        };
        let mut builder = SentinelClientBuilder::new(
            parsed.sentinels.iter().map(addr),
            &parsed.primary,
            SentinelServerType::Master,
        )
        .map_err(|e| e.to_string())?
        .set_client_to_redis_db(parsed.db);
        if parsed.tls {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        }
        if let Some(username) = &parsed.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &parsed.password {
            builder = builder.set_client_to_redis_password(password);
        }
        let client = builder.build().map_err(|e| e.to_string())?;
        Ok(Self {
            client: tokio::sync::Mutex::new(client),
        })
    }

    /// A client for the primary the sentinels name now.
    pub(super) async fn primary(&self) -> redis::RedisResult<redis::Client> {
        self.client.lock().await.async_get_client().await
    }
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
    fn knows_a_sentinel_url() {
        assert!(is_sentinel_url("redis+sentinel://s/m"));
        assert!(is_sentinel_url("rediss+sentinel://s/m"));
        assert!(!is_sentinel_url("redis://h"));
    }
}
