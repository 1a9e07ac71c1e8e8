//! TLS on the gRPC port: the server's certificate and key, an optional client CA that makes
//! it mutual TLS, the CA that peer instances' certificates are checked against when calls
//! are forwarded to them, and the reloading of all of them when their files change.
//!
//! Every file is read again every [`RELOAD_INTERVAL`]; when the bytes differ, a new
//! configuration is built and, only if it is whole (certificate and key parse and match,
//! CAs parse), it replaces the old one for every connection accepted from then on. Open
//! connections keep the configuration they were accepted with. A bad file keeps the old
//! configuration and is logged with the reason, so a half-written rotation (a new
//! certificate before its key) never takes the port down.
//!
//! Handshakes run off the accept loop, each within [`HANDSHAKE_TIMEOUT`] and at most
//! [`MAX_HANDSHAKES`] at once, so a slow or silent client cannot hold up others. A client
//! that speaks plaintext to a TLS port fails its handshake and is disconnected.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

use crate::reload::{digest, every_interval, Digest32, Swapped};

/// How often the certificate, key and CA files are checked for changes.
pub use crate::reload::RELOAD_INTERVAL;
/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most TLS handshakes in progress at once; connections past it wait in the listen backlog.
pub const MAX_HANDSHAKES: usize = 256;

/// Where the TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM, leaf first). Also this instance's client
    /// certificate when it forwards calls to a peer.
    pub cert: PathBuf,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates (PEM) that client certificates must chain to; set, every client
    /// must present one (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// CA certificates (PEM) that peer instances' server certificates must chain to, for
    /// forwarded calls. Default: `client_ca`.
    pub peer_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn all(&self) -> Vec<&Path> {
        let mut files = vec![self.cert.as_path(), self.key.as_path()];
        files.extend(self.client_ca.as_deref());
        files.extend(self.peer_ca.as_deref());
        files
    }
}

/// Why the TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} holds no {what} (expected PEM)")]
    Missing { path: String, what: &'static str },
    #[error("{path}: {detail}")]
    Invalid { path: String, detail: String },
}

/// One consistent set of TLS material, as read from the files.
struct Material {
    server: Arc<ServerConfig>,
    /// PEM bytes for the client side of forwarded calls.
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    peer_ca_pem: Option<Vec<u8>>,
    /// The server certificate's identity (see [`identity_of`]).
    identity: Option<String>,
}

/// The TLS configuration of the gRPC port, reloaded when its files change.
pub struct ServerTls {
    files: TlsFiles,
    material: Swapped<Material>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The material the client side of a forwarded call needs: PEM bytes.
#[derive(Clone, Debug)]
pub struct PeerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub ca_pem: Option<Vec<u8>>,
}

impl ServerTls {
    /// Reads and checks every file. Fails with the file and the reason.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let (digest, bytes) = read_all(&files)?;
        let material = build(&files, &bytes)?;
        Ok(ServerTls {
            files,
            material: Swapped::new(material, digest),
        })
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The identity in this instance's own certificate (what its peers see it as).
    pub fn own_identity(&self) -> Option<String> {
        self.material().identity.clone()
    }

    /// What a forwarded call's connection presents and trusts.
    pub fn peer(&self) -> PeerTls {
        let m = self.material();
        PeerTls {
            cert_pem: m.cert_pem.clone(),
            key_pem: m.key_pem.clone(),
            ca_pem: m.peer_ca_pem.clone(),
        }
    }

    fn material(&self) -> Arc<Material> {
        self.material.get()
    }

    /// Reads the files again and, when they changed and make a whole configuration, uses
    /// it for new connections. `Ok(true)`: reloaded; `Ok(false)`: unchanged (or the same
    /// bad version as last time); `Err`: changed but unusable, the old configuration kept.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (digest, bytes) = read_all(&self.files)?;
        self.material.offer(digest, || build(&self.files, &bytes))
    }

    /// Reloads every [`RELOAD_INTERVAL`] until dropped (run it as a task).
    pub async fn watch(self: Arc<Self>) {
        let mut failing = false;
        every_interval(|| {
            match self.reload() {
                Ok(true) => {
                    failing = false;
                    tracing::info!(
                        identity = self.own_identity().as_deref().unwrap_or("-"),
                        "TLS certificate, key and CAs reloaded; new connections use them"
                    );
                }
                Ok(false) => {}
                // An unreadable file mid-rotation is reported once until it changes again.
                Err(err) if !failing || !matches!(err, TlsError::Read { .. }) => {
                    failing = true;
                    tracing::warn!(
                        error = %err,
                        "TLS files changed but cannot be used; keeping the previous certificate",
                    );
                }
                Err(_) => {}
            }
        })
        .await;
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.material().server.clone())
    }
}

fn read_all(files: &TlsFiles) -> Result<(Digest32, Vec<Vec<u8>>), TlsError> {
    let mut all = Vec::new();
    for path in files.all() {
        let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.display().to_string(),
            source,
        })?;
        all.push(bytes);
    }
    Ok((digest(all.iter().map(Vec::as_slice)), all))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            path: path.display().to_string(),
            detail: format!("not a PEM certificate list: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Missing {
            path: path.display().to_string(),
            what: "certificate",
        });
    }
    Ok(certs)
}

fn roots(path: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs(path, pem)? {
        store.add(cert).map_err(|e| TlsError::Invalid {
            path: path.display().to_string(),
            detail: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(store)
}

fn build(files: &TlsFiles, bytes: &[Vec<u8>]) -> Result<Material, TlsError> {
    let (cert_pem, key_pem) = (&bytes[0], &bytes[1]);
    let chain = certs(&files.cert, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Invalid {
        path: files.key.display().to_string(),
        detail: format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
    })?;
    let identity = identity_of(&chain[0]);
    let mut next = 2;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid {
            path: files.cert.display().to_string(),
            detail: e.to_string(),
        })?;
    let builder = match &files.client_ca {
        Some(path) => {
            let store = roots(path, &bytes[next])?;
            next += 1;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
                .build()
                .map_err(|e| TlsError::Invalid {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut server = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Invalid {
            path: format!("{} and {}", files.cert.display(), files.key.display()),
            detail: format!("the certificate and key do not make a usable pair: {e}"),
        })?;
    // gRPC is HTTP/2 only.
    server.alpn_protocols = vec![b"h2".to_vec()];
    let peer_ca_pem = match (&files.peer_ca, &files.client_ca) {
        (Some(path), _) => {
            let pem = bytes[next].clone();
            roots(path, &pem)?;
            Some(pem)
        }
        (None, Some(_)) => Some(bytes[2].clone()),
        (None, None) => None,
    };
    Ok(Material {
        server: Arc::new(server),
        cert_pem: cert_pem.clone(),
        key_pem: key_pem.clone(),
        peer_ca_pem,
        identity,
    })
}

/// The identity a certificate names: its first URI SAN (a SPIFFE id, say), else its first
/// DNS SAN, else its subject's common name.
pub fn identity_of(cert: &CertificateDer<'_>) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        let names = &san.value.general_names;
        let uri = names.iter().find_map(|n| match n {
            GeneralName::URI(uri) => Some(uri.to_string()),
            _ => None,
        });
        let dns = names.iter().find_map(|n| match n {
            GeneralName::DNSName(dns) => Some(dns.to_string()),
            _ => None,
        });
        if let Some(name) = uri.or(dns) {
            return Some(name);
        }
    }
    let cn = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string);
    cn
}

/// The connections accepted on `listener`, each after its TLS handshake with the
/// configuration current when it was accepted. Ends when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ServerTls>,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(MAX_HANDSHAKES);
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                permit = handshakes.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                () = tx.closed() => return,
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, say: wait a little rather than spin.
                    tracing::warn!(error = %err, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Without TCP_NODELAY small ReadResponses wait for the client's delayed ACK.
            let _ = tcp.set_nodelay(true);
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    // A TCP probe (Consul's check) connects and closes without a word.
                    Ok(Err(err)) if err.kind() == std::io::ErrorKind::UnexpectedEof => {
                        tracing::trace!(%peer, "a connection closed before its TLS handshake");
                    }
                    Ok(Err(err)) => {
                        tracing::info!(
                            %peer,
                            error = %err,
                            "TLS handshake failed; connection closed",
                        );
                    }
                    Err(_) => {
                        tracing::info!(
                            %peer,
                            timeout = ?HANDSHAKE_TIMEOUT,
                            "TLS handshake timed out; connection closed",
                        );
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
