//! The read deadline of request bodies (DESIGN.md §14: every network read
//! has a deadline).
//!
//! actix-web bounds the request head (`client_request_timeout`, set in
//! `master.rs`) but not the body: a client sending one byte a second held
//! a connection, and the handler's future, for as long as it liked. Every
//! `/api/v1` request's body is read through [`Deadlined`], which ends the
//! body with a `TimedOut` error once `request_body_timeout` has passed
//! since the head was read. The JSON extractor turns that into `400
//! body_timeout` ([`super::error::json_error`]), and actix closes the
//! connection, since the rest of the body was never read.
//!
//! A package upload (`PUT /api/v1/packages/...`) is left alone: it may be
//! large and slow yet moving, and has a progress deadline of its own
//! (`upload_idle_timeout`, `upload_min_rate`, in `actors::packages`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::middleware::Next;
use actix_web::{HttpMessage, web};
use bytes::Bytes;
use futures::Stream;

use super::AppState;

/// actix's boxed body stream (`actix_http::BoxedPayloadStream`).
type BoxedBody = Pin<Box<dyn Stream<Item = Result<Bytes, PayloadError>>>>;

/// What [`Deadlined`] says when the deadline passes; the JSON error
/// handler recognizes it.
pub const BODY_TIMEOUT: &str = "the request body was not received within request_body_timeout";

/// A request body that fails with [`BODY_TIMEOUT`] once `sleep` fires.
struct Deadlined {
    inner: Payload,
    sleep: Pin<Box<tokio::time::Sleep>>,
    done: bool,
}

impl Stream for Deadlined {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        // The body first: bytes already here are not refused because the
        // deadline passed while no one was reading.
        match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(item)) => Poll::Ready(Some(item)),
            // Polling the timer registers its wakeup: a client that sends
            // nothing more wakes this at the deadline.
            Poll::Pending => match self.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.done = true;
                    let e = std::io::Error::new(std::io::ErrorKind::TimedOut, BODY_TIMEOUT);
                    Poll::Ready(Some(Err(PayloadError::Io(e))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

/// Whether a request's body is exempt: a package upload, which has its
/// own progress deadline.
fn exempt(req: &ServiceRequest) -> bool {
    req.method() == actix_web::http::Method::PUT && req.path().starts_with("/api/v1/packages/")
}

/// Middleware: puts the deadline on the request's body.
pub async fn limit(
    mut req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let timeout = req.app_data::<web::Data<AppState>>().map(|s| s.request_body_timeout);
    if let Some(timeout) = timeout.filter(|_| !exempt(&req)) {
        let inner = req.take_payload();
        let body = Deadlined { inner, sleep: Box::pin(tokio::time::sleep(timeout)), done: false };
        req.set_payload(Payload::from(Box::pin(body) as BoxedBody));
    }
    next.call(req).await
}

/// Whether a payload error is [`Deadlined`]'s.
pub fn is_body_timeout(e: &PayloadError) -> bool {
    matches!(e, PayloadError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut && io.to_string() == BODY_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_body_that_stops_coming_fails_at_the_deadline_and_one_that_is_whole_passes() {
        // A body that never ends: the deadline ends it.
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, PayloadError>>(1);
        let never = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
        let inner = Payload::from(Box::pin(never) as BoxedBody);
        let mut body = Deadlined { inner, sleep: Box::pin(tokio::time::sleep(Duration::from_millis(50))), done: false };
        let started = std::time::Instant::now();
        let item = tokio::time::timeout(Duration::from_secs(5), body.next()).await.expect("ended by the deadline");
        assert!(matches!(&item, Some(Err(e)) if is_body_timeout(e)), "{item:?}");
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(body.next().await.is_none(), "nothing after the error");

        // A body already whole is read whole, deadline or not.
        let whole = futures::stream::iter([Ok(Bytes::from_static(b"{}"))]);
        let inner = Payload::from(Box::pin(whole) as BoxedBody);
        let mut body = Deadlined { inner, sleep: Box::pin(tokio::time::sleep(Duration::ZERO)), done: false };
        assert_eq!(body.next().await.unwrap().unwrap(), Bytes::from_static(b"{}"));
        assert!(body.next().await.is_none());
    }
}
