//! Calls served on a task of their own (streamed calls): the request body fed to the task as
//! its DATA frames arrive ([`RecvBody`]), the answer sent back to the connection as events
//! ([`Responder`], then [`Sending`]).

use super::*;

/// What a stream's task tells the connection.
pub(super) enum Event {
    Head(u32, StatusCode, HeaderMap),
    Data(u32, Bytes),
    Trailers(u32, HeaderMap),
    End(u32),
    /// The call is over (its answer ended, or not: then the stream is reset).
    Gone(u32),
}

/// Serves one call on its own task until it ends or the stream or connection goes.
pub(super) async fn drive(
    id: u32,
    call: StreamFuture,
    events: mpsc::Sender<Event>,
    cancel: CancellationToken,
) {
    tokio::select! {
        () = call => {
            let _ = events.send(Event::Gone(id)).await;
        }
        () = cancel.cancelled() => {}
    }
}

/// The stream or its connection is gone: nothing more can be sent on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

impl std::fmt::Display for Gone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the HTTP/2 stream is gone")
    }
}

impl std::error::Error for Gone {}

/// Answers a streamed call: its head first ([`Responder::head`]).
pub struct Responder {
    id: u32,
    events: mpsc::Sender<Event>,
}

impl Responder {
    pub(super) fn new(id: u32, events: mpsc::Sender<Event>) -> Self {
        Self { id, events }
    }

    /// Sends the answer's head: `status` and `headers`; the body and its end follow.
    pub async fn head(self, status: StatusCode, headers: HeaderMap) -> Result<Sending, Gone> {
        self.events
            .send(Event::Head(self.id, status, headers))
            .await
            .map_err(|_| Gone)?;
        Ok(Sending {
            id: self.id,
            events: self.events,
        })
    }
}

/// Sends a streamed call's answer after its head: DATA within the client's windows (queued
/// while they are closed, within the connection's bound), then trailers or the end.
pub struct Sending {
    id: u32,
    events: mpsc::Sender<Event>,
}

impl Sending {
    /// Sends `data` as the answer's body (more may follow).
    pub async fn data(&mut self, data: Bytes) -> Result<(), Gone> {
        self.events
            .send(Event::Data(self.id, data))
            .await
            .map_err(|_| Gone)
    }

    /// Ends the answer with `trailers`.
    pub async fn trailers(self, trailers: HeaderMap) -> Result<(), Gone> {
        self.events
            .send(Event::Trailers(self.id, trailers))
            .await
            .map_err(|_| Gone)
    }

    /// Ends the answer without trailers.
    pub async fn end(self) -> Result<(), Gone> {
        self.events
            .send(Event::End(self.id))
            .await
            .map_err(|_| Gone)
    }
}

/// A request body broke off (the stream was reset).
#[derive(Debug)]
pub struct Broken;

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request stream broke off")
    }
}

impl std::error::Error for Broken {}

/// Tells a connection that a stream's task took body bytes (their window can go back).
#[derive(Default)]
pub(super) struct Taken {
    pub(super) any: std::sync::atomic::AtomicBool,
    pub(super) waker: futures_util::task::AtomicWaker,
}

/// The request body of a call served on its own task, as its DATA frames arrive: a stream of
/// chunks that ends with the request (or with [`Broken`] when the stream is reset). Taking a
/// chunk gives its window back to the client.
pub struct RecvBody {
    pub(super) receiver: mpsc::UnboundedReceiver<Result<Bytes, Broken>>,
    pub(super) queued: Arc<AtomicUsize>,
    pub(super) taken: Arc<Taken>,
}

impl futures_util::Stream for RecvBody {
    type Item = Result<Bytes, Broken>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match ready!(self.receiver.poll_recv(cx)) {
            Some(Ok(data)) => {
                self.queued.fetch_sub(data.len(), Ordering::AcqRel);
                self.taken.any.store(true, Ordering::Release);
                self.taken.waker.wake();
                Poll::Ready(Some(Ok(data)))
            }
            other => Poll::Ready(other),
        }
    }
}
