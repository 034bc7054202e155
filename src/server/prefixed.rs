//! A client connection with bytes already read from it in front: what one
//! hyper HTTP/1.1 connection had read past its request (pipelined requests)
//! is read first by the next one, so nothing the client sent is lost. The
//! connection is a TCP socket, or TLS over one ([`Transport`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// What a connection is served over: a TCP socket, or TLS over one.
pub(super) trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The TCP socket underneath.
    fn socket(&self) -> &TcpStream;

    /// Whether this layer holds request bytes already taken from the
    /// socket (TLS: decrypted and not yet read), so that waiting on the
    /// socket for the next request would miss them.
    fn holds_unread(&mut self) -> bool;
}

impl Transport for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }

    fn holds_unread(&mut self) -> bool {
        false
    }
}

impl Transport for TlsStream<TcpStream> {
    fn socket(&self) -> &TcpStream {
        self.get_ref().0
    }

    fn holds_unread(&mut self) -> bool {
        // Complete records already read are decrypted now; a broken one
        // counts as unread, so that hyper reads it and ends the connection.
        self.get_mut()
            .1
            .process_new_packets()
            .map_or(true, |state| state.plaintext_bytes_to_read() > 0)
    }
}

/// `stream`, with `unread` read from it first.
#[derive(Debug)]
pub(super) struct Prefixed<S> {
    unread: Bytes,
    stream: S,
}

impl<S: Transport> Prefixed<S> {
    /// `stream` with nothing in front.
    pub(super) fn new(stream: S) -> Self {
        Self {
            unread: Bytes::new(),
            stream,
        }
    }

    /// The TCP socket underneath.
    pub(super) fn socket(&self) -> &TcpStream {
        self.stream.socket()
    }

    /// Whether bytes already read wait in front of the socket (here, or
    /// inside the TLS layer).
    pub(super) fn has_unread(&mut self) -> bool {
        !self.unread.is_empty() || self.stream.holds_unread()
    }

    /// Put `bytes` (read from this stream after whatever it still holds in
    /// front, and not used) back in front of everything else.
    pub(super) fn unread(mut self, bytes: Bytes) -> Self {
        if bytes.is_empty() {
            return self;
        }
        self.unread = if self.unread.is_empty() {
            bytes
        } else {
            let mut both = BytesMut::with_capacity(bytes.len() + self.unread.len());
            both.extend_from_slice(&bytes);
            both.extend_from_slice(&self.unread);
            both.freeze()
        };
        self
    }
}

impl<S: Transport> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.unread.is_empty() {
            return Pin::new(&mut self.stream).poll_read(cx, buf);
        }
        let n = self.unread.len().min(buf.remaining());
        buf.put_slice(&self.unread.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl<S: Transport> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn unread_bytes_come_first_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        client.write_all(b"-socket").await.unwrap();
        drop(client);
        let mut io = Prefixed::new(server)
            .unread(Bytes::from_static(b"-held"))
            .unread(Bytes::from_static(b"first"));
        assert!(io.has_unread());
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"first-held-socket");
        assert!(!io.has_unread());
    }
}
