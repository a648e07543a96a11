//! Calls served on a task of their own (RLQS, health): the request body fed to the task, the
//! answer's frames sent back to the connection as events.

use super::*;

/// What a stream's task tells the connection.
pub(super) enum Event {
    Head(u32, StatusCode, HeaderMap),
    Data(u32, Bytes),
    Trailers(u32, HeaderMap),
    End(u32),
}

/// Serves one call on its own task: the service's answer sent to the connection as events.
pub(super) async fn drive(
    id: u32,
    answer: StreamFuture,
    events: mpsc::Sender<Event>,
    cancel: CancellationToken,
) {
    let run = async {
        let answer = answer.await;
        let (parts, mut body) = answer.into_parts();
        if events
            .send(Event::Head(id, parts.status, parts.headers))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let event = match body.frame().await {
                None => Event::End(id),
                Some(Err(status)) => Event::Trailers(id, status_trailers(&status)),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if events.send(Event::Data(id, data)).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => Event::Trailers(id, trailers),
                        Err(_) => continue,
                    },
                },
            };
            let _ = events.send(event).await;
            return;
        }
    };
    tokio::select! {
        () = run => {}
        () = cancel.cancelled() => {}
    }
}

/// A request body broke off (the stream was reset).
#[derive(Debug)]
pub(crate) struct Broken;

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

/// The request body of a call served on its own task, as its DATA frames arrive.
pub(crate) struct RecvBody {
    pub(super) receiver: mpsc::UnboundedReceiver<Result<Bytes, Broken>>,
    pub(super) queued: Arc<AtomicUsize>,
    pub(super) taken: Arc<Taken>,
}

impl hyper::body::Body for RecvBody {
    type Data = Bytes;
    type Error = Broken;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Broken>>> {
        match ready!(self.receiver.poll_recv(cx)) {
            Some(Ok(data)) => {
                self.queued.fetch_sub(data.len(), Ordering::AcqRel);
                self.taken.any.store(true, Ordering::Release);
                self.taken.waker.wake();
                Poll::Ready(Some(Ok(hyper::body::Frame::data(data))))
            }
            Some(Err(broken)) => Poll::Ready(Some(Err(broken))),
            None => Poll::Ready(None),
        }
    }
}
