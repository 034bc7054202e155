//! Keep-alive HTTP/1.1 connections to the target: a request takes an idle
//! one, else opens a new one while fewer than the maximum are open, else
//! gets none (a client overrun: the generator never waits for a
//! connection, which would slip its schedule).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Why no connection could be opened.
#[derive(Debug)]
pub enum ConnectError {
    /// The TCP connect failed.
    Tcp(std::io::Error),
    /// The HTTP/1.1 handshake failed.
    Handshake(hyper::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(e) => write!(f, "connect: {e}"),
            Self::Handshake(e) => write!(f, "HTTP/1.1 handshake: {e}"),
        }
    }
}

/// What asking for a connection gives.
pub enum Got {
    /// One, idle or new.
    Conn(Conn),
    /// None: every one busy and no more may open.
    Overrun,
}

/// An open connection; dropping it closes it (and frees its place).
pub struct Conn {
    /// Where requests are sent on it.
    pub sender: SendRequest<Full<Bytes>>,
    _place: Place,
}

/// One of the `max` places, given back when the connection goes.
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connections to one address.
pub struct Pool {
    authority: String,
    max: usize,
    open: Arc<AtomicUsize>,
    opened: AtomicU64,
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    /// Connections to `authority` (`host:port`), at most `max` open.
    pub fn new(authority: String, max: usize) -> Self {
        Self {
            authority,
            max,
            open: Arc::new(AtomicUsize::new(0)),
            opened: AtomicU64::new(0),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An idle connection, a new one, or none.
    pub async fn get(&self) -> Result<Got, ConnectError> {
        loop {
            let conn = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match conn {
                // Closed by the server while idle: dropped, try the next.
                Some(conn) if conn.sender.is_closed() => continue,
                Some(conn) => return Ok(Got::Conn(conn)),
                None => break,
            }
        }
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Ok(Got::Overrun);
        }
        let place = Place(Arc::clone(&self.open));
        let stream = TcpStream::connect(&self.authority)
            .await
            .map_err(ConnectError::Tcp)?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(ConnectError::Handshake)?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(Got::Conn(Conn {
            sender,
            _place: place,
        }))
    }

    /// A connection whose answer was read whole, for the next request.
    pub fn give_back(&self, conn: Conn) {
        if !conn.sender.is_closed() {
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
        }
    }

    /// Connections opened since the start.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
}
