//! Which protocol a new connection speaks, told from its first bytes
//! without reading them (hyper reads them afterwards): the 24-byte HTTP/2
//! client preface means h2c with prior knowledge, any other first bytes
//! HTTP/1.1.

use std::io;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// What a client sends first when it speaks HTTP/2 (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    /// HTTP/1.1 (or 1.0, or bytes hyper will answer with 400).
    Http1,
    /// h2c with prior knowledge.
    Http2,
}

/// Wait until the first bytes tell the protocol: all of the preface, or a
/// byte that differs from it. `None` if the client closed first or the
/// socket failed. No deadline of its own: the caller's.
pub(super) async fn detect(stream: &TcpStream) -> Option<Protocol> {
    let mut seen = [0u8; H2_PREFACE.len()];
    loop {
        let n = stream.peek(&mut seen).await.ok()?;
        if n == 0 {
            return None;
        }
        if seen[..n] != H2_PREFACE[..n] {
            return Some(Protocol::Http1);
        }
        if n == H2_PREFACE.len() {
            return Some(Protocol::Http2);
        }
        // Part of the preface. Peeked bytes stay unread, so the socket stays
        // readable and the next peek would return at once: clear that
        // readiness (a closure that reports `WouldBlock` makes tokio clear
        // it, unless a newer readiness event came meanwhile) and wait for
        // more bytes instead of spinning.
        let _ = stream.try_io(Interest::READABLE, || {
            Err::<(), _>(io::Error::from(io::ErrorKind::WouldBlock))
        });
    }
}
