//! The bearer token every call of a client carries, as a tonic
//! interceptor on the channel.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::Error;
use crate::error::ErrorKind;

/// The channel every call goes through: the connection, with the bearer
/// token (if any) added to each call's metadata.
pub(crate) type Transport = InterceptedService<Channel, Bearer>;

/// Adds `authorization: Bearer TOKEN` to every call (issue 16), or nothing:
/// public so that a plain tonic client of the same server (`charon
/// bench`'s unary clients) sends the token exactly as this one does.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(…)")
    }
}

impl Bearer {
    /// The interceptor for `token` (none: calls go as they are); a token
    /// that cannot be metadata is a client error.
    pub fn new(token: Option<&crate::options::Token>) -> Result<Self, Error> {
        token
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {}", t.0)).map_err(|_| {
                    Error::new(
                        ErrorKind::Settings,
                        "the token must be printable ASCII without line breaks",
                    )
                })
            })
            .transpose()
            .map(Bearer)
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}
