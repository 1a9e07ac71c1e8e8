//! Certificates made by the test itself: a CA, and server and client certificates it signs,
//! written as PEM files into a directory of the test's own.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority that signs the test's certificates.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub pem: String,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The files of an [`Issued`] certificate.
#[derive(Debug, Clone)]
pub struct IssuedFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA named `name`.
    ///
    /// # Panics
    /// If key generation fails (it does not, for these parameters).
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("CA certificate");
        let pem = issuer.pem();
        TestCa { issuer, pem }
    }

    /// A server certificate for `names` (DNS names or IP addresses; the first one is its
    /// identity), usable as a client certificate too (gateways present it to each other).
    pub fn server(&self, names: &[&str]) -> Issued {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("server params");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("server"),
        );
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.issue(params)
    }

    /// A client certificate whose only name is its common name `cn`.
    pub fn client(&self, cn: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes the CA certificate to `dir/<name>.pem`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, &self.pem).expect("write CA");
        path
    }
}

impl Issued {
    /// Writes the certificate and key to `dir/<name>.pem` and `dir/<name>.key`.
    pub fn write(&self, dir: &Path, name: &str) -> IssuedFiles {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write certificate");
        std::fs::write(&key, &self.key_pem).expect("write key");
        IssuedFiles { cert, key }
    }
}
