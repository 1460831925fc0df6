//! TLS, and mutual TLS, on the server's gRPC and HTTP listeners (rustls,
//! ring), with a certificate that is replaced while the server runs.
//!
//! - The certificate chain, its key and the optional client CA are read at
//!   start (a problem then is an error at start), and again on SIGHUP and
//!   when their contents change (the `FileWatch` of the configuration
//!   file, over the three files together). A new set
//!   is used for connections accepted from then on; connections already
//!   open, and the sessions and holds on them, are not touched.
//! - A set that cannot be used (a half-written file, a key that does not
//!   match the certificate, an empty file, a CA that is not one) is
//!   refused: the previous one stays in force, the error is logged, counted
//!   (`charon_tls_reloads_total{result="refused"}`, gauge
//!   `charon_tls_reload_failing`) and shown by `/readyz`. The same bytes
//!   are not tried again until they change or SIGHUP asks.
//! - A certificate chain that has expired or is not valid yet is refused
//!   the same way, at start and on reload ([`validity`]): served, it would
//!   make every client that verifies it fail its handshake. The chain in
//!   force's expiry is exported (`charon_tls_certificate_expiry_seconds`,
//!   Unix seconds) and `/readyz` names it in its last day.
//! - Each accepted connection's handshake runs in its own task, bounded by
//!   [`HANDSHAKE_TIMEOUT`]: a client that stalls it holds up nobody else,
//!   and a failed handshake only ends that connection.
//! - With a client CA, a client must present a certificate it signed, on
//!   both listeners (refused at the handshake otherwise). The server's own
//!   certificate is accepted as a client certificate too: the embedded
//!   configuration service's feed connects to its own HTTP listener with
//!   it ([`ServerTls::loopback_client`]); only a holder of the server's
//!   key can present it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::{Stream, StreamExt};
use tracing::{debug, error, info, warn};

use crate::Shutdown;
use crate::file_reload::FileWatch;
use crate::metrics;

pub mod validity;

use validity::Validity;

/// The longest a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the server's certificate comes from (`charon serve --tls-cert
/// --tls-key [--tls-client-ca]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// Its PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates: when set, every client must present a
    /// certificate one of them signed (mutual TLS), on both listeners.
    pub client_ca: Option<PathBuf>,
}

/// The files as last read, to tell a change from none.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Contents {
    fn read(settings: &TlsSettings) -> Result<Self, String> {
        let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        Ok(Self {
            cert: read(&settings.cert)?,
            key: read(&settings.key)?,
            client_ca: settings.client_ca.as_deref().map(read).transpose()?,
        })
    }

    /// The files as the watch yields them: certificate, key, client CA.
    fn from_files(files: Vec<Vec<u8>>) -> Result<Self, String> {
        let mut files = files.into_iter();
        match (files.next(), files.next()) {
            (Some(cert), Some(key)) => Ok(Self {
                cert,
                key,
                client_ca: files.next(),
            }),
            _ => Err("the TLS files were not all read".to_owned()),
        }
    }
}

/// One usable set: what the listeners hand out.
#[derive(Debug)]
struct Loaded {
    /// ALPN `h2` only: gRPC.
    grpc: Arc<ServerConfig>,
    /// ALPN `h2` and `http/1.1`.
    http: Arc<ServerConfig>,
    /// The certificate and key served, for the loopback client.
    own: Arc<CertifiedKey>,
    /// When the chain may be used.
    validity: Validity,
    contents: Contents,
}

/// The server's TLS: the set in force and what the reloader knows.
#[derive(Debug)]
pub struct ServerTls {
    settings: TlsSettings,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<Loaded>,
    /// Why the last set was refused, while the files still hold it.
    problem: Mutex<Option<String>>,
}

impl ServerTls {
    /// Reads and checks the files: an error says which file and why.
    pub fn load(settings: TlsSettings) -> Result<Arc<Self>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let contents = Contents::read(&settings)?;
        let loaded = build(&settings, &provider, contents, validity::now())?;
        metrics::tls_certificate_expiry(loaded.validity.not_after);
        Ok(Arc::new(Self {
            settings,
            provider,
            current: ArcSwap::from_pointee(loaded),
            problem: Mutex::new(None),
        }))
    }

    /// What the files said when a reload was refused, while the previous
    /// certificate is still served because of it.
    pub fn problem(&self) -> Option<String> {
        self.problem.lock().ok().and_then(|p| p.clone())
    }

    /// What `/readyz` says of the certificate in force in its last day
    /// (or once expired), if it is.
    pub fn expiry_warning(&self) -> Option<String> {
        validity::warning(
            &self.current.load().validity,
            validity::now(),
            &self.settings.cert.display().to_string(),
        )
    }

    /// Whether a client certificate is required.
    pub fn mutual(&self) -> bool {
        self.settings.client_ca.is_some()
    }

    /// Uses the files' new contents if they can be used and differ from
    /// the set in force (the watch yields the same bytes again only on
    /// SIGHUP, so a refused set is not retried until it changes).
    fn reload(&self, contents: Result<Contents, String>) {
        let contents = match contents {
            Ok(c) => c,
            Err(e) => return self.refuse(e),
        };
        if contents == self.current.load().contents {
            self.clear_problem();
            return;
        }
        match build(&self.settings, &self.provider, contents, validity::now()) {
            Ok(loaded) => {
                metrics::tls_certificate_expiry(loaded.validity.not_after);
                self.current.store(Arc::new(loaded));
                self.clear_problem();
                metrics::tls_reload(true);
                info!(
                    cert = %self.settings.cert.display(),
                    "TLS certificate reloaded; new connections get it"
                );
            }
            Err(e) => self.refuse(e),
        }
    }

    fn refuse(&self, why: String) {
        metrics::tls_reload(false);
        error!("TLS files refused; the previous certificate is still served: {why}");
        if let Ok(mut p) = self.problem.lock() {
            *p = Some(why);
        }
    }

    fn clear_problem(&self) {
        if let Ok(mut p) = self.problem.lock()
            && p.take().is_some()
        {
            metrics::tls_reload_failing(false);
        }
    }

    /// Keeps the set in force in step with the files, on SIGHUP and when
    /// they change (the `FileWatch` of the configuration file, over the
    /// three files together), until shutdown.
    pub fn spawn_reloader(self: &Arc<Self>, shutdown: Shutdown) {
        let tls = self.clone();
        let mut paths = vec![tls.settings.cert.clone(), tls.settings.key.clone()];
        paths.extend(tls.settings.client_ca.clone());
        let mut watch = match FileWatch::of_files(paths, "TLS files") {
            Ok(w) => w,
            Err(e) => return error!("TLS files are not reloaded: {e}"),
        };
        tokio::spawn(async move {
            loop {
                match watch.next_all(&shutdown).await {
                    Ok(Some(files)) => tls.reload(files.and_then(Contents::from_files)),
                    Ok(None) => return,
                    Err(e) => return error!("TLS files are not reloaded: {e}"),
                }
            }
        });
    }

    /// A rustls client configuration that trusts exactly the certificate
    /// this server serves at the time of each handshake, and presents it as
    /// its client certificate: the embedded configuration service's feed,
    /// which connects to this server's own HTTP listener, uses it (the
    /// certificate need not name `127.0.0.1`, nor be signed by a CA this
    /// process knows).
    pub fn loopback_client(self: &Arc<Self>) -> Result<rustls::ClientConfig, String> {
        let own = Arc::new(OwnCertificate(self.clone()));
        let config = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(own.clone())
            .with_client_cert_resolver(own);
        Ok(config)
    }

    fn grpc_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load().grpc.clone())
    }

    fn http_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load().http.clone())
    }
}

/// Builds the server configurations of one set of files, refusing a
/// chain that is not valid at `now` (Unix seconds).
fn build(
    settings: &TlsSettings,
    provider: &Arc<CryptoProvider>,
    contents: Contents,
    now: i64,
) -> Result<Loaded, String> {
    let cert_file = settings.cert.display();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&contents.cert)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{cert_file}: not a PEM certificate chain: {e}"))?;
    if chain.is_empty() {
        return Err(format!("{cert_file}: no certificate in it"));
    }
    let validity = validity::of_chain(&chain, &cert_file.to_string())?;
    validity::check(&validity, now, &cert_file.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(&contents.key)
        .map_err(|e| format!("{}: no usable PEM private key: {e}", settings.key.display()))?;
    let own = CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        format!(
            "{cert_file} and {}: the key does not go with the certificate, or cannot be used: {e}",
            settings.key.display()
        )
    })?;
    let own = Arc::new(own);
    let verifier: Option<Arc<dyn ClientCertVerifier>> =
        match (&settings.client_ca, &contents.client_ca) {
            (Some(path), Some(pem)) => {
                let mut roots = RootCertStore::empty();
                for ca in CertificateDer::pem_slice_iter(pem) {
                    let ca = ca.map_err(|e| format!("{}: not PEM: {e}", path.display()))?;
                    roots
                        .add(ca)
                        .map_err(|e| format!("{}: not a CA certificate: {e}", path.display()))?;
                }
                if roots.is_empty() {
                    return Err(format!("{}: no certificate in it", path.display()));
                }
                let ca =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                Some(Arc::new(CaOrOwn {
                    ca,
                    own: CertificateDer::from(
                        own.end_entity_cert()
                            .map_err(|e| e.to_string())?
                            .as_ref()
                            .to_vec(),
                    ),
                }))
            }
            _ => None,
        };
    let config = |alpn: &[&[u8]]| -> Result<Arc<ServerConfig>, String> {
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &verifier {
            Some(v) => builder.with_client_cert_verifier(v.clone()),
            None => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(CertifiedKey::clone(&own))));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    };
    Ok(Loaded {
        grpc: config(&[b"h2"])?,
        http: config(&[b"h2", b"http/1.1"])?,
        own,
        validity,
        contents,
    })
}

/// Client certificates signed by the client CA, or the server's own
/// (its feed's loopback connection).
#[derive(Debug)]
struct CaOrOwn {
    ca: Arc<dyn ClientCertVerifier>,
    own: CertificateDer<'static>,
}

impl ClientCertVerifier for CaOrOwn {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.ca.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.own.as_ref() {
            // The handshake's signature (checked below, as for any
            // client) proves the key.
            return Ok(ClientCertVerified::assertion());
        }
        self.ca.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.ca.supported_verify_schemes()
    }
}

/// The loopback client's view: the server it talks to must present the
/// certificate in force (and prove its key), and it presents the same.
#[derive(Debug)]
struct OwnCertificate(Arc<ServerTls>);

impl ServerCertVerifier for OwnCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let current = self.0.current.load();
        match current.own.end_entity_cert() {
            Ok(own) if own.as_ref() == end_entity.as_ref() => Ok(ServerCertVerified::assertion()),
            _ => Err(rustls::Error::General(
                "not this server's own certificate".to_owned(),
            )),
        }
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
            &self.0.provider.signature_verification_algorithms,
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
            &self.0.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0
            .provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl rustls::client::ResolvesClientCert for OwnCertificate {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current.load().own.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Accepted connections waiting to be served, at most this many at once
/// (their handshakes wait to hand them over meanwhile).
const HANDED_OVER: usize = 64;

/// The gRPC connections of `tcp` (accepted, TCP options set) after their
/// TLS handshake. Accept errors are passed on; a failed or stalled
/// handshake is logged and skipped. Ends when `tcp` ends (and the
/// handshakes under way are over), or when the stream is dropped.
pub(crate) fn grpc_incoming<S>(
    tls: Arc<ServerTls>,
    tcp: S,
) -> impl Stream<Item = std::io::Result<TlsStream<TcpStream>>> + Send + 'static
where
    S: Stream<Item = std::io::Result<TcpStream>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(HANDED_OVER);
    tokio::spawn(async move {
        let mut tcp = std::pin::pin!(tcp);
        loop {
            let next = tokio::select! {
                next = tcp.next() => next,
                () = tx.closed() => return,
            };
            match next {
                None => return,
                Some(Err(e)) => {
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                }
                Some(Ok(stream)) => {
                    let acceptor = tls.grpc_acceptor();
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        if let Some(stream) = handshake(acceptor, stream, "gRPC").await {
                            let _ = tx.send(Ok(stream)).await;
                        }
                    });
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The HTTP listener's connections after their TLS handshake, for
/// `axum::serve`. TCP_NODELAY is set on each.
#[derive(Debug)]
pub(crate) struct HttpListener {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl HttpListener {
    /// Accepts on `listener` in a task of its own until this is dropped.
    pub(crate) fn new(tls: Arc<ServerTls>, listener: TcpListener) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(HANDED_OVER);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = tx.closed() => return,
                };
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors, say: the next accept may
                        // work once some are closed (axum's own listener
                        // does the same).
                        warn!("HTTP listener: cannot accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let acceptor = tls.http_acceptor();
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Some(stream) = handshake(acceptor, stream, "HTTP").await {
                        let _ = tx.send((stream, peer)).await;
                    }
                });
            }
        });
        Ok(Self {
            connections: rx,
            addr,
        })
    }
}

impl axum::serve::Listener for HttpListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(c) => c,
            // The accepting task is gone only if it panicked: nothing will
            // come any more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// One connection's handshake, bounded by [`HANDSHAKE_TIMEOUT`]; `None`
/// (logged at debug level: scanners and health checks that only open a
/// TCP connection are common) when it fails.
async fn handshake(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    listener: &'static str,
) -> Option<TlsStream<TcpStream>> {
    let peer = stream.peer_addr().ok();
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            metrics::tls_handshake_failed(listener);
            debug!(?peer, listener, "TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            metrics::tls_handshake_failed(listener);
            debug!(
                ?peer,
                listener, "TLS handshake not finished within {HANDSHAKE_TIMEOUT:?}"
            );
            None
        }
    }
}
