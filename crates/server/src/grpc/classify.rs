//! Statuses tonic answers on its own, before the service sees a request
//! (a unary request it could not read, an unsupported encoding), get the
//! SPEC §5 class like every other status of the service.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use super::status;

/// A gRPC service whose trailers-only error answers that carry no
/// `charon-error-class` are classified by [`status::inbound`].
#[derive(Debug, Clone)]
pub struct Classified<S>(pub S);

impl<S: NamedService> NamedService for Classified<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Classified<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Unpin + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Classify<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        Classify(self.0.call(request))
    }
}

/// The answer of a [`Classified`] service: the inner service's, its
/// headers classified once it is ready. A future of its own rather than a
/// boxed `async` block: every call went through it, and each paid an
/// allocation for nothing (tonic's generated services already answer with
/// a boxed, hence `Unpin`, future).
#[derive(Debug)]
pub struct Classify<F>(F);

impl<F> Future for Classify<F>
where
    F: Future<Output = Result<http::Response<Body>, Infallible>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut response = ready!(Pin::new(&mut self.0).poll(cx))?;
        classify(response.headers_mut());
        Poll::Ready(Ok(response))
    }
}

/// Rewrites a trailers-only error status in `headers` that has no class.
/// (A stream's final status travels in trailers; the session driver
/// classifies those itself.)
fn classify(headers: &mut http::HeaderMap) {
    if headers.contains_key(status::CLASS_KEY) {
        return;
    }
    let Some(tonic_status) = tonic::Status::from_header_map(headers) else {
        return;
    };
    if tonic_status.code() == tonic::Code::Ok {
        return;
    }
    let classified = status::inbound(tonic_status);
    if let Err(e) = classified.add_header(headers) {
        tracing::warn!(status = %e, "could not classify a status");
    }
}
