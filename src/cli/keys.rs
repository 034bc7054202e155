//! `idemgate keys …`: converts the CLI's arguments into a
//! [`KeyCommand`] and runs it on the store the configuration names.
//! SQLite, PostgreSQL and Redis are reached directly. A `memory://` store lives in
//! the gateway process: the command goes to that gateway's admin listener
//! (`POST /keys`), within a deadline.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use super::{KeyArgs, KeysCommand};
use crate::admin::keys::{
    self as key_admin, EraseTarget, KeyCommand, KeyTarget, KeysError, ListQuery,
};
use crate::config::{AdminToken, Config};
use crate::request::body::{self, Body};
use crate::store::{self, Store, StoreAdmin};

/// The admin API's command for these arguments.
pub fn command(args: KeysCommand) -> KeyCommand {
    let target = |a: KeyArgs| KeyTarget {
        route: a.route,
        scope: a.scope,
        key: a.key,
        parts: a.parts,
        json: a.json,
        force: a.force,
    };
    match args {
        KeysCommand::Show(a) => KeyCommand::Show(target(a)),
        KeysCommand::List {
            route,
            state,
            limit,
            json,
        } => KeyCommand::List(ListQuery {
            route,
            state: state.into(),
            limit,
            json,
        }),
        KeysCommand::Release(a) => KeyCommand::Release(target(a)),
        KeysCommand::Delete(a) => KeyCommand::Delete(target(a)),
        KeysCommand::Erase(a) => KeyCommand::Erase(EraseTarget {
            scope: a.scope,
            scope_digest: a.scope_digest,
            force: a.force,
        }),
    }
}

/// Run one keys command; returns what to print. `admin_timeout` bounds the
/// whole exchange with a gateway's admin listener (memory:// stores).
pub async fn run(
    config: &Config,
    args: KeysCommand,
    admin_timeout: Duration,
) -> Result<String, KeysError> {
    let command = command(args);
    if config.store.url.starts_with("memory:") {
        let addr = crate::admin::probe_address(config.admin_listen);
        let token = config.admin_token.as_ref();
        return remote(addr, token, &command, admin_timeout).await;
    }
    let backend = store::open(&config.store).await?;
    let records: &dyn StoreAdmin = backend.as_ref();
    let path: &dyn Store = backend.as_ref();
    let output = key_admin::execute(config, records, path, command).await;
    records.close().await;
    output
}

/// Send a command to a running gateway's admin listener at `addr`.
async fn remote(
    addr: SocketAddr,
    token: Option<&AdminToken>,
    command: &KeyCommand,
    deadline: Duration,
) -> Result<String, KeysError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        KeysError::Admin(format!(
            "a memory:// store lives inside the gateway: cannot reach its admin listener at {addr} ({e}); is the gateway running with this config?"
        ))
    };
    let exchange = async {
        let client: Client<HttpConnector, Body> =
            Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
        let json = serde_json::to_vec(command).expect("commands serialise");
        let mut request = http::Request::post(format!("http://{addr}/keys"))
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            let bearer = format!("Bearer {}", token.expose());
            request = request.header(http::header::AUTHORIZATION, bearer);
        }
        let request = request.body(body::full(json)).expect("a valid request");
        let response = client.request(request).await.map_err(|e| unreachable(&e))?;
        let status = response.status();
        // Only the key administration's own "no record" is not-found.
        let absent = response
            .headers()
            .get(key_admin::NOT_FOUND_HEADER)
            .is_some_and(|v| v == "not-found");
        let text = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(&e))?
            .to_bytes();
        Ok::<_, KeysError>((status, absent, String::from_utf8_lossy(&text).into_owned()))
    };
    let (status, absent, text) = tokio::time::timeout(deadline, exchange)
        .await
        .map_err(|_| unreachable(&format_args!("no answer within {deadline:?}")))??;
    if status.is_success() {
        return Ok(text);
    }
    // Refusals and errors are problem+json: show what they say.
    let said = crate::admin::problem::detail_of(text.as_bytes())
        .unwrap_or_else(|| text.trim_end().to_string());
    match status {
        http::StatusCode::NOT_FOUND if absent => Err(KeysError::Absent(said)),
        _ => Err(KeysError::Admin(said)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::keys::KeyTarget;

    #[tokio::test]
    async fn a_silent_admin_listener_times_out() {
        // Accepts, reads nothing, answers nothing.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let mut open = Vec::new();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                open.push(stream);
            }
        });
        let command = KeyCommand::Show(KeyTarget {
            route: "r".into(),
            scope: Vec::new(),
            key: Some("k".into()),
            parts: Vec::new(),
            json: false,
            force: false,
        });
        let exchange = remote(addr, None, &command, Duration::from_millis(300));
        let error = tokio::time::timeout(Duration::from_secs(60), exchange)
            .await
            .expect("the deadline must end the exchange")
            .unwrap_err();
        assert!(
            error.to_string().contains("no answer within"),
            "unexpected error: {error}"
        );
        hold.abort();
    }

    /// Only the key administration's own 404 (marked) is "not found"
    /// (exit 3); any other 404, say from a proxy port named by mistake, is
    /// a failure.
    #[tokio::test]
    async fn only_a_marked_404_means_no_record() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for (marked, not_found) in [(true, true), (false, false)] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let serve = tokio::spawn(async move {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut request = vec![0; 4096];
                let _ = stream.read(&mut request).await;
                let mark = if marked {
                    "idemgate-keys: not-found\r\n"
                } else {
                    ""
                };
                let answer = format!(
                    "HTTP/1.1 404 Not Found\r\n{mark}content-length: 3\r\nconnection: close\r\n\r\nno\n"
                );
                stream.write_all(answer.as_bytes()).await.unwrap();
            });
            let command = KeyCommand::Show(KeyTarget {
                route: "r".into(),
                scope: Vec::new(),
                key: Some("k".into()),
                parts: Vec::new(),
                json: false,
                force: false,
            });
            let error = remote(addr, None, &command, Duration::from_secs(10))
                .await
                .unwrap_err();
            assert_eq!(error.is_not_found(), not_found, "{error:?}");
            serve.await.unwrap();
        }
    }
}
