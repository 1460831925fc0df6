//! Certificates for private TLS servers (Redis, `charon serve
//! --tls-cert`), made at run time with rcgen: a CA, a server certificate
//! for `127.0.0.1` and `localhost`, and a client certificate, as PEM files
//! in a temporary directory; more server certificates on demand, and a
//! small HTTPS client that records the certificate a server presents.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tempfile::TempDir;

use crate::charon::HttpProbe;

/// A CA of its own and the certificates it signed, as files. Removed on
/// drop. Two of them are two CAs that do not trust each other.
pub struct TestPki {
    dir: TempDir,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl TestPki {
    /// Makes the CA (`ca.pem`), the server certificate (`server.pem`,
    /// `server.key`: `127.0.0.1` and `localhost`) and the client
    /// certificate (`client.pem`, `client.key`).
    pub fn new() -> Self {
        Self::named("charon test CA")
    }

    /// [`TestPki::new`] with a CA of this common name.
    pub fn named(ca_name: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for certificates");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.distinguished_name.push(DnType::CommonName, ca_name);
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("self-signed CA");
        let pki = Self {
            dir,
            issuer: Issuer::new(ca, ca_key),
        };
        pki.write("ca.pem", &ca_cert.pem());
        pki.issue_server("server", "charon test redis");
        let (client, client_key) = pki.leaf(
            Vec::new(),
            "charon test client",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        pki.write("client.pem", &client);
        pki.write("client.key", &client_key);
        pki
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.path().join(name), text).expect("write a certificate file");
    }

    fn leaf(
        &self,
        names: Vec<String>,
        cn: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> (String, String) {
        self.leaf_valid(names, cn, usage, None)
    }

    /// A leaf certificate and its key; valid from `from` until `until`
    /// (Unix seconds) when given, else for rcgen's default period.
    fn leaf_valid(
        &self,
        names: Vec<String>,
        cn: &str,
        usage: ExtendedKeyUsagePurpose,
        valid: Option<(i64, i64)>,
    ) -> (String, String) {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        if let Some((from, until)) = valid {
            let at = |t| time::OffsetDateTime::from_unix_timestamp(t).expect("a valid time");
            params.not_before = at(from);
            params.not_after = at(until);
        }
        let cert = params.signed_by(&key, &self.issuer).expect("sign a leaf");
        (cert.pem(), key.serialize_pem())
    }

    /// Another server certificate of this CA for `127.0.0.1` and
    /// `localhost`, valid from `from` until `until` (Unix seconds: one
    /// that has expired, is not valid yet, or expires in a minute), as
    /// `NAME.pem` and `NAME.key`; returns their paths.
    pub fn issue_server_valid(
        &self,
        name: &str,
        cn: &str,
        from: i64,
        until: i64,
    ) -> (PathBuf, PathBuf) {
        let (cert, key) = self.leaf_valid(
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            cn,
            ExtendedKeyUsagePurpose::ServerAuth,
            Some((from, until)),
        );
        self.write(&format!("{name}.pem"), &cert);
        self.write(&format!("{name}.key"), &key);
        (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}.key")),
        )
    }

    /// Unix seconds now (for [`TestPki::issue_server_valid`]).
    pub fn now() -> i64 {
        i64::try_from(UnixTime::now().as_secs()).expect("a time after 1970")
    }

    /// Another server certificate of this CA for `127.0.0.1` and
    /// `localhost`, with common name `cn` (and a serial of its own), as
    /// `NAME.pem` and `NAME.key`; returns their paths.
    pub fn issue_server(&self, name: &str, cn: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = self.leaf(
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            cn,
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        self.write(&format!("{name}.pem"), &cert);
        self.write(&format!("{name}.key"), &key);
        (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}.key")),
        )
    }

    /// Another client certificate of this CA, with common name `cn`, as
    /// `NAME.pem` and `NAME.key`; returns their paths.
    pub fn issue_client(&self, name: &str, cn: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = self.leaf(Vec::new(), cn, ExtendedKeyUsagePurpose::ClientAuth);
        self.write(&format!("{name}.pem"), &cert);
        self.write(&format!("{name}.key"), &key);
        (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}.key")),
        )
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server certificate (PEM), for `127.0.0.1` and `localhost`.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// The server certificate's key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The client certificate (PEM).
    pub fn client_cert(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The client certificate's key (PEM).
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// The contents of one of the files (for a store's `RedisTls`).
    pub fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).expect("read a certificate file")
    }

    /// The DER of the first certificate of a PEM file: what a server
    /// with that file presents.
    pub fn der(path: &Path) -> Vec<u8> {
        CertificateDer::pem_file_iter(path)
            .expect("read a certificate file")
            .next()
            .expect("a certificate in the file")
            .expect("a PEM certificate")
            .as_ref()
            .to_vec()
    }

    /// A rustls client that trusts this CA and, with `client_cert`,
    /// presents this CA's client certificate.
    pub fn client_config(&self, client_cert: bool) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(self.ca()).expect("CA file") {
            roots.add(ca.expect("CA PEM")).expect("CA certificate");
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
        let mut config = if client_cert {
            let chain = CertificateDer::pem_file_iter(self.client_cert())
                .expect("client certificate")
                .collect::<Result<Vec<_>, _>>()
                .expect("client certificate PEM");
            let key = PrivateKeyDer::from_pem_file(self.client_key()).expect("client key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client certificate and key")
        } else {
            builder.with_no_client_auth()
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A rustls client that trusts this CA and presents `presenter`'s
    /// client certificate (one this CA did not sign).
    pub fn client_config_presenting(&self, presenter: &TestPki) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(self.ca()).expect("CA file") {
            roots.add(ca.expect("CA PEM")).expect("CA certificate");
        }
        let chain = CertificateDer::pem_file_iter(presenter.client_cert())
            .expect("client certificate")
            .collect::<Result<Vec<_>, _>>()
            .expect("client certificate PEM");
        let key = PrivateKeyDer::from_pem_file(presenter.client_key()).expect("client key");
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .expect("client certificate and key");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// `charon serve` (the binary `bin`) with the limits `config` over TLS
    /// with `cert` and `key` (copied into its directory as `tls.pem` and
    /// `tls.key`, where a reload test replaces them) and the flags
    /// `extra`, ready once `/readyz` answers over HTTPS with this CA (and
    /// this CA's client certificate with `client_cert`: a server that
    /// requires one).
    pub fn serve(
        &self,
        bin: &Path,
        config: &str,
        (cert, key): (&Path, &Path),
        extra: &[&str],
        client_cert: bool,
    ) -> crate::CharonProcess {
        let mut args = vec![
            "--config",
            "{dir}/limits.yaml",
            "--tls-cert",
            "{dir}/tls.pem",
            "--tls-key",
            "{dir}/tls.key",
        ];
        args.extend_from_slice(extra);
        // The files must be there before the process starts (it reads
        // them at start), in its directory (`{dir}`).
        crate::CharonProcess::start_probed_with(
            bin,
            &args,
            "/readyz",
            self.probe(client_cert),
            |dir: &Path| {
                std::fs::write(dir.join("limits.yaml"), config).expect("limits");
                std::fs::copy(cert, dir.join("tls.pem")).expect("certificate");
                std::fs::copy(key, dir.join("tls.key")).expect("key");
            },
        )
    }

    /// How a [`crate::CharonProcess`] under TLS is probed: HTTPS with
    /// this CA (and this CA's client certificate with `client_cert`).
    pub fn probe(&self, client_cert: bool) -> HttpProbe {
        let config = self.client_config(client_cert);
        HttpProbe::new(move |port, path| https_get(&config, port, path))
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A minimal HTTP/1.1 GET over TLS on 127.0.0.1:`port`: (status, body),
/// or `None` when the connection or the handshake fails.
pub fn https_get(config: &Arc<ClientConfig>, port: u16, path: &str) -> Option<(u16, String)> {
    let name = ServerName::try_from("127.0.0.1").ok()?;
    let conn = rustls::ClientConnection::new(config.clone(), name).ok()?;
    let tcp = TcpStream::connect(("127.0.0.1", port)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    // A server that closes without close_notify is fine once the answer
    // is in.
    if let Err(e) = tls.read_to_end(&mut raw)
        && raw.is_empty()
    {
        let _ = e;
        return None;
    }
    crate::charon::parse_response(&raw)
}

/// The certificate (DER) a TLS server on 127.0.0.1:`port` presents to a
/// new connection, whoever signed it; `None` if no handshake starts.
pub fn presented_certificate(port: u16) -> Option<Vec<u8>> {
    let seen = Arc::new(Recorder::default());
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(seen.clone())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from("127.0.0.1").ok()?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // The server's certificate arrives before any client certificate is
    // asked for: the handshake may then fail (mutual TLS), the record stays.
    while conn.is_handshaking() {
        if conn.complete_io(&mut tcp).is_err() {
            break;
        }
    }
    seen.0.lock().ok()?.clone()
}

/// Accepts any server certificate and keeps the last one.
#[derive(Debug, Default)]
struct Recorder(Mutex<Option<Vec<u8>>>);

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.0.lock().expect("recorder") = Some(end_entity.as_ref().to_vec());
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
