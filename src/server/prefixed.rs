//! A client socket with bytes already read from it in front: what one
//! hyper HTTP/1.1 connection had read past its request (pipelined requests)
//! is read first by the next one, so nothing the client sent is lost.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// `stream`, with `unread` read from it first.
#[derive(Debug)]
pub(super) struct Prefixed {
    unread: Bytes,
    stream: TcpStream,
}

impl Prefixed {
    /// `stream` with nothing in front.
    pub(super) fn new(stream: TcpStream) -> Self {
        Self {
            unread: Bytes::new(),
            stream,
        }
    }

    /// The socket.
    pub(super) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Whether bytes already read wait in front of the socket.
    pub(super) fn has_unread(&self) -> bool {
        !self.unread.is_empty()
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

impl AsyncRead for Prefixed {
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

impl AsyncWrite for Prefixed {
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
