//! One request: a POST with a JSON body of the asked size and, with
//! `--key new`, an `Idempotency-Key` no other request of any run carries;
//! sent on a pooled connection and read whole, or classified by how it
//! failed.

use std::error::Error as _;
use std::io::ErrorKind;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue, RETRY_AFTER};
use hyper::{Request, Uri};
use tokio::time::Instant;

use crate::pool::{Got, Pool};
use crate::settings::{Key, Settings};
use crate::tally::Outcome;

/// The JSON body around the padding (the bench's usual payment).
const HEAD: &str = r#"{"amount":1200,"currency":"eur","pad":""#;
const TAIL: &str = r#""}"#;

/// Whether a connect error was said already.
static SAID: AtomicBool = AtomicBool::new(false);

/// What every request shares.
pub struct Shooter {
    pool: Arc<Pool>,
    uri: Uri,
    host: HeaderValue,
    body: Bytes,
    /// `--key new`: the run's prefix of every key.
    key_prefix: Option<String>,
}

impl Shooter {
    /// Requests as the settings ask, on `pool`.
    pub fn new(settings: &Settings, pool: Arc<Pool>) -> Result<Self, String> {
        let authority = settings.url.authority().ok_or("the URL has no host")?;
        let host = HeaderValue::from_str(authority.as_str()).map_err(|e| e.to_string())?;
        let key_prefix = (settings.key == Key::New).then(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            format!("lg-{:x}-{:x}-", std::process::id(), nanos)
        });
        Ok(Self {
            pool,
            uri: settings.url.clone(),
            host,
            body: body(settings.body_bytes)?,
            key_prefix,
        })
    }

    /// Send request `i` and read its answer whole, by `deadline`.
    pub async fn shoot(&self, i: u64, deadline: Instant) -> Outcome {
        match tokio::time::timeout_at(deadline, self.exchange(i)).await {
            Ok(outcome) => outcome,
            // The connection (if any) is dropped with the future: closed.
            Err(_) => Outcome::Timeout,
        }
    }

    async fn exchange(&self, i: u64) -> Outcome {
        let mut conn = match self.pool.get().await {
            Ok(Got::Conn(conn)) => conn,
            Ok(Got::Overrun) => return Outcome::Overrun,
            Err(e) => {
                if !SAID.swap(true, Ordering::Relaxed) {
                    eprintln!("loadgen: {e} (said once; every such request is counted)");
                }
                return Outcome::ConnectError;
            }
        };
        let mut request = Request::post(self.uri.clone())
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, "application/json");
        if let Some(prefix) = &self.key_prefix {
            request = request.header("idempotency-key", format!("{prefix}{i}"));
        }
        let Ok(request) = request.body(Full::new(self.body.clone())) else {
            return Outcome::Error;
        };
        if let Err(e) = conn.sender.ready().await {
            return classify(&e);
        }
        let response = match conn.sender.send_request(request).await {
            Ok(r) => r,
            Err(e) => return classify(&e),
        };
        let status = response.status().as_u16();
        let retry_after = response.headers().contains_key(RETRY_AFTER);
        if let Err(e) = response.into_body().collect().await {
            return classify(&e);
        }
        self.pool.give_back(conn);
        Outcome::Answered {
            status,
            retry_after,
        }
    }
}

/// A connection closed or reset before the whole answer is a reset;
/// anything else an error.
fn classify(error: &hyper::Error) -> Outcome {
    if error.is_incomplete_message() || error.is_canceled() || error.is_closed() {
        return Outcome::Reset;
    }
    let mut source = error.source();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof => Outcome::Reset,
                _ => Outcome::Error,
            };
        }
        source = e.source();
    }
    Outcome::Error
}

/// A JSON body of exactly `bytes` bytes.
fn body(bytes: usize) -> Result<Bytes, String> {
    let frame = HEAD.len() + TAIL.len();
    if bytes < frame {
        return Err(format!("--body-bytes is at least {frame}"));
    }
    Ok(Bytes::from(format!(
        "{HEAD}{}{TAIL}",
        "x".repeat(bytes - frame)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_json_of_the_asked_size() {
        let b = body(512).unwrap();
        assert_eq!(b.len(), 512);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["amount"], 1200);
        assert!(body(10).is_err());
    }
}
