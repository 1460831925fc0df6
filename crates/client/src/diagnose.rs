//! What a connection that closed without a word meant. A server that
//! died closes connections; so does a TLS server that refuses the
//! client's certificate after a TLS 1.3 handshake (its alert is lost in the
//! HTTP/2 layer), and so does a TLS port spoken to in plain text. The first
//! is a server error (degraded mode may grant), the others are mistakes of
//! the caller's configuration that must never be: when a call fails that
//! way, one connection of its own looks at what the server says at the
//! TLS level.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;

use crate::classify::tls_failure;
use crate::error::{Error, ErrorKind};
use crate::options::ClientTls;

/// The client's preface of HTTP/2 and an empty SETTINGS frame: what a
/// gRPC client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// The client-class cause of an ambiguous failure with the server at
/// `address` (an `http://` or `https://` URL; `tls` as the client uses
/// it), if there is one, found before `deadline`. `None`: the server looks
/// like one that stopped or broke, a server error as it was.
pub(crate) async fn diagnose(
    address: &str,
    tls: Option<&ClientTls>,
    deadline: Instant,
) -> Option<Error> {
    let uri: tonic::codegen::http::Uri = address.parse().ok()?;
    let secure = uri.scheme_str() == Some("https") || tls.is_some();
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let tcp = timeout_at(deadline, TcpStream::connect((host, port)))
        .await
        .ok()?
        .ok()?;
    let name = tls
        .and_then(|t| t.server_name.clone())
        .unwrap_or_else(|| host.to_owned());
    let name = ServerName::try_from(name).ok()?;
    if secure {
        refused_after_handshake(tcp, name, tls, address, deadline).await
    } else {
        speaks_tls(tcp, name, address, deadline).await
    }
}

/// A TLS connection like the client's (its client certificate, if any;
/// any server certificate, which the client itself checked already): does
/// the server refuse it once HTTP/2 starts?
async fn refused_after_handshake(
    tcp: TcpStream,
    name: ServerName<'static>,
    tls: Option<&ClientTls>,
    address: &str,
    deadline: Instant,
) -> Option<Error> {
    let connector = TlsConnector::from(Arc::new(config(tls)?));
    let mut stream = match timeout_at(deadline, connector.connect(name, tcp))
        .await
        .ok()?
    {
        Ok(s) => s,
        Err(e) => return rustls_cause(&e).map(|e| tls_failure(e, address)),
    };
    stream.write_all(PREFACE).await.ok()?;
    stream.flush().await.ok()?;
    let mut buf = [0u8; 64];
    match timeout_at(deadline, stream.read(&mut buf)).await.ok()? {
        Ok(_) => None,
        Err(e) => rustls_cause(&e).map(|e| tls_failure(e, address)),
    }
}

/// A TLS handshake with a plain-text client's server: one that answers it
/// (with its certificate, or an alert) speaks TLS on this port.
async fn speaks_tls(
    tcp: TcpStream,
    name: ServerName<'static>,
    address: &str,
    deadline: Instant,
) -> Option<Error> {
    let connector = TlsConnector::from(Arc::new(config(None)?));
    let tls_answer = match timeout_at(deadline, connector.connect(name, tcp))
        .await
        .ok()?
    {
        Ok(_) => true,
        Err(e) => rustls_cause(&e).is_some_and(|e| {
            !matches!(
                e,
                rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. }
            )
        }),
    };
    tls_answer.then(|| {
        Error::new(
            ErrorKind::WrongProtocol,
            format!(
                "{address} speaks TLS, and this client plain text: connect with https:// and the \
                 CA that signed the server's certificate (the CLI's --ca, ClientTls::ca_pem)"
            ),
        )
    })
}

fn rustls_cause(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// A rustls client that accepts any server certificate and presents the
/// client's own, if it has one (ALPN `h2`, as gRPC).
fn config(tls: Option<&ClientTls>) -> Option<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    let mut config = match tls.and_then(|t| t.identity_pem.as_ref()) {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_slice(key).ok()?;
            builder.with_client_auth_cert(chain, key).ok()?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Some(config)
}

/// Accepts every server certificate: the diagnosis looks at what the
/// server does after the handshake, not at whether it is trusted (the
/// client's own connection checked that, and said so if not).
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
