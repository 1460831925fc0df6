//! Certificates for a private TLS Redis, made at run time with rcgen: a CA,
//! a server certificate for `127.0.0.1` and `localhost`, and a client
//! certificate, as PEM files in a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tempfile::TempDir;

/// A CA of its own and the certificates it signed, as files. Removed on
/// drop. Two of them are two CAs that do not trust each other.
#[derive(Debug)]
pub struct TestPki {
    dir: TempDir,
}

impl TestPki {
    /// Makes the CA (`ca.pem`), the server certificate (`server.pem`,
    /// `server.key`: `127.0.0.1` and `localhost`) and the client
    /// certificate (`client.pem`, `client.key`).
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for certificates");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.distinguished_name
            .push(DnType::CommonName, "charon test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("self-signed CA");
        let issuer = Issuer::new(ca, ca_key);
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).expect("write a certificate file");
        };
        write("ca.pem", &ca_cert.pem());
        let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().expect("leaf key");
            let mut params = CertificateParams::new(names).expect("leaf params");
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &issuer).expect("sign a leaf");
            (cert.pem(), key.serialize_pem())
        };
        let (server, server_key) = leaf(
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            "charon test redis",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        write("server.pem", &server);
        write("server.key", &server_key);
        let (client, client_key) = leaf(
            Vec::new(),
            "charon test client",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        write("client.pem", &client);
        write("client.key", &client_key);
        Self { dir }
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
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}
