//! The body types the gateway serves, forwards and receives, and bounded
//! reading of bodies into memory (request bodies up to `max_request_body`
//! and within the shared budget, upstream responses up to
//! `max_recorded_response`).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A boxed error crossing a body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every body idemgate sends, to clients and to upstreams.
pub type Body = BoxBody<Bytes, BoxError>;

/// A client's request body as the server hands it to a handler: hyper's,
/// and, on an HTTP/1.1 connection, a [`BodyTracker`] that learns whether it
/// was read to its end and gets back what the handler left unread.
pub struct RequestBody {
    /// `None` only once dropped.
    inner: Option<Incoming>,
    tracker: Option<Arc<BodyTracker>>,
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody").finish_non_exhaustive()
    }
}

/// What the server learns of a request body it handed to a handler: whether
/// its end was seen (all of it was read, so the connection can take another
/// request; see `server::h1`), and the unread rest if the handler dropped it
/// before its end.
#[derive(Default)]
pub(crate) struct BodyTracker {
    ended: AtomicBool,
    left: Mutex<Option<Incoming>>,
}

impl BodyTracker {
    /// Whether the body's end has been seen.
    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The unread rest of a body dropped before its end, once.
    pub(crate) fn take_left(&self) -> Option<Incoming> {
        self.left.lock().ok()?.take()
    }
}

impl RequestBody {
    /// `inner`, told to `tracker` (if any).
    pub(crate) fn new(inner: Incoming, tracker: Option<Arc<BodyTracker>>) -> Self {
        let body = Self {
            inner: Some(inner),
            tracker,
        };
        // An empty body has ended before it is read.
        body.is_end_stream();
        body
    }

    fn mark_ended(&self) {
        if let Some(tracker) = &self.tracker {
            tracker.ended.store(true, Ordering::Release);
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if let Some(tracker) = &self.tracker
            && !tracker.ended()
            && let Ok(mut left) = tracker.left.lock()
        {
            *left = self.inner.take();
        }
    }
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = std::task::ready!(Pin::new(&mut *inner).poll_frame(cx));
        // A reader may stop at `is_end_stream` without polling for the end.
        if frame.is_none() || inner.is_end_stream() {
            self.mark_ended();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        let ended = self.inner.as_ref().is_none_or(HttpBody::is_end_stream);
        if ended {
            self.mark_ended();
        }
        ended
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// Box any body whose errors can be boxed.
pub fn boxed<B>(body: B) -> Body
where
    B: HttpBody<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// What bounded reading found.
pub enum Collected<B> {
    /// The whole body, within the limit.
    Complete(Bytes),
    /// The body is larger than the limit: what was read, and the rest unread.
    Over {
        /// The bytes read so far (more than the limit).
        prefix: Bytes,
        /// The unread remainder.
        rest: B,
    },
}

impl<B> std::fmt::Debug for Collected<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collected").finish_non_exhaustive()
    }
}

/// Read `body` into memory until it ends or exceeds `limit` bytes, calling
/// `on_chunk` with every chunk as it arrives. Trailers are dropped.
pub async fn collect_up_to<B>(
    mut body: B,
    limit: usize,
    mut on_chunk: impl FnMut(&[u8]),
) -> Result<Collected<B>, B::Error>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        on_chunk(&data);
        buf.extend_from_slice(&data);
        if buf.len() > limit {
            return Ok(Collected::Over {
                prefix: buf.freeze(),
                rest: body,
            });
        }
    }
    Ok(Collected::Complete(buf.freeze()))
}

/// A body that yields `prefix` first, then everything `rest` yields: an
/// over-cap response, forwarded as it streams after the part already read.
pub struct Prefixed<B> {
    prefix: Option<Bytes>,
    rest: B,
}

impl<B> std::fmt::Debug for Prefixed<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefixed").finish_non_exhaustive()
    }
}

impl<B> Prefixed<B> {
    /// Chain `prefix` before `rest`.
    pub fn new(prefix: Bytes, rest: B) -> Self {
        Self {
            prefix: Some(prefix).filter(|p| !p.is_empty()),
            rest,
        }
    }
}

impl<B> HttpBody for Prefixed<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let extra = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + extra);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + extra);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;

    fn chunks(
        parts: &[&'static [u8]],
    ) -> impl HttpBody<Data = Bytes, Error = std::convert::Infallible> + Unpin {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn within_limit_is_complete_and_chunks_are_seen() {
        let mut seen = 0;
        match collect_up_to(chunks(&[b"ab", b"cd"]), 4, |c| seen += c.len())
            .await
            .unwrap()
        {
            Collected::Complete(b) => assert_eq!(&b[..], b"abcd"),
            Collected::Over { .. } => panic!("should fit"),
        }
        assert_eq!(seen, 4);
    }

    #[tokio::test]
    async fn over_limit_keeps_prefix_and_rest_streams_on() {
        match collect_up_to(chunks(&[b"ab", b"cd", b"ef"]), 3, |_| {})
            .await
            .unwrap()
        {
            Collected::Complete(_) => panic!("should not fit"),
            Collected::Over { prefix, rest } => {
                assert_eq!(&prefix[..], b"abcd");
                let all = Prefixed::new(prefix, rest)
                    .collect()
                    .await
                    .unwrap()
                    .to_bytes();
                assert_eq!(&all[..], b"abcdef");
            }
        }
    }
}

/// A request body paid for from a shared budget as it arrives: each data
/// frame reserves its length (the permits gather in `reserved`, which the
/// caller holds as long as the bytes stay in memory), and a frame the budget
/// cannot cover ends the body with [`BudgetedError::Spent`]. A client that
/// declares a large body and sends little holds only what it sent.
pub struct Budgeted<'a, B> {
    inner: B,
    budget: &'a Arc<Semaphore>,
    reserved: &'a mut Reservation,
}

impl<B> std::fmt::Debug for Budgeted<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgeted").finish_non_exhaustive()
    }
}

/// The bytes of the shared body budget one request holds: given back when
/// it is dropped, however the request ends.
#[derive(Debug, Default)]
pub struct Reservation(Option<OwnedSemaphorePermit>);

impl<'a, B> Budgeted<'a, B> {
    /// The body still unread (what was paid for stays reserved).
    pub fn into_inner(self) -> B {
        self.inner
    }

    /// Read `inner`, paying from `budget` into `reserved`.
    pub fn new(inner: B, budget: &'a Arc<Semaphore>, reserved: &'a mut Reservation) -> Self {
        Self {
            inner,
            budget,
            reserved,
        }
    }
}

/// Why a [`Budgeted`] body ended early.
#[derive(Debug, thiserror::Error)]
pub enum BudgetedError<E> {
    /// The body itself failed.
    #[error(transparent)]
    Body(E),
    /// The budget could not cover the next frame.
    #[error("the budget for buffered request bodies is spent")]
    Spent,
}

impl<B> HttpBody for Budgeted<'_, B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = BudgetedError<B::Error>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let frame = match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(error)) => return Poll::Ready(Some(Err(BudgetedError::Body(error)))),
            Some(Ok(frame)) => frame,
        };
        if let Some(data) = frame.data_ref() {
            let paid = u32::try_from(data.len())
                .ok()
                .and_then(|n| this.budget.clone().try_acquire_many_owned(n).ok());
            match (paid, this.reserved.0.as_mut()) {
                (None, _) => return Poll::Ready(Some(Err(BudgetedError::Spent))),
                (Some(paid), Some(held)) => held.merge(paid),
                (Some(paid), None) => this.reserved.0 = Some(paid),
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
