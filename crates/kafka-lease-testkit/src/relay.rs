//! A TCP relay for fault injection: put it between a client and a real service, then cut
//! every connection through it, hold traffic (new connections wait, bytes stop flowing) and
//! let it go again, or fail the next request that starts with given bytes (for a text
//! protocol such as Consul's HTTP API): lose it on the way, or lose its answer after the
//! service acted on it. Listens on loopback only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running relay from a loopback port of its own to `target`. Dropping it stops it and
/// closes every connection through it.
/// What happens to a request picked out by [`Relay::fail_next`]. Either way the client's
/// connection closes without an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The request never reaches the service.
    LoseRequest,
    /// The service gets the request and acts on it; its answer is lost.
    LoseAnswer,
}

/// Faults armed for the next requests with a prefix; each fires once.
type Faults = Arc<Mutex<Vec<(Vec<u8>, Fault)>>>;

pub struct Relay {
    addr: SocketAddr,
    target: SocketAddr,
    held: watch::Sender<bool>,
    faults: Faults,
    /// Faults that fired so far.
    fired: Arc<AtomicU64>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accepted: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    kinds: Kinds,
    acceptor: JoinHandle<()>,
}

/// Requests relayed, by kind (see [`Relay::requests_of`]).
type Kinds = Arc<Mutex<std::collections::HashMap<String, u64>>>;

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("addr", &self.addr)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// Starts relaying from `127.0.0.1:<free port>` to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Relay> {
        Self::start_at(SocketAddr::from(([127, 0, 0, 1], 0)), target).await
    }

    /// Starts relaying from `listen` (a loopback address; port 0 picks a free one) to
    /// `target`. A fixed port is for a service that advertises the relay's address, as the
    /// test broker's `RELAYED` listener does.
    pub async fn start_at(listen: SocketAddr, target: SocketAddr) -> std::io::Result<Relay> {
        assert!(listen.ip().is_loopback(), "relays listen on loopback only");
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (held, _) = watch::channel(false);
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accepted = Arc::new(AtomicU64::new(0));
        let faults: Faults = Arc::default();
        let fired = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let kinds: Kinds = Arc::default();
        let acceptor = {
            let kinds = kinds.clone();
            let held = held.clone();
            let connections = connections.clone();
            let accepted = accepted.clone();
            let (faults, fired, requests) = (faults.clone(), fired.clone(), requests.clone());
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    let _ = inbound.set_nodelay(true);
                    let task = tokio::spawn(relay_one(
                        inbound,
                        target,
                        held.subscribe(),
                        faults.clone(),
                        fired.clone(),
                        requests.clone(),
                        kinds.clone(),
                    ));
                    let mut all = connections.lock().unwrap_or_else(|p| p.into_inner());
                    all.retain(|t| !t.is_finished());
                    all.push(task);
                }
            })
        };
        Ok(Relay {
            addr,
            target,
            held,
            faults,
            fired,
            connections,
            accepted,
            requests,
            kinds,
            acceptor,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// HTTP requests relayed so far (client reads that start with an HTTP method: a count
    /// for a protocol like Consul's API, where each request starts a fresh read).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// HTTP requests relayed so far whose method and path start with `kind`, up to the
    /// path's second segment: `"PUT /v1/txn"`, `"GET /v1/kv"`, `"DELETE /v1/kv"`,
    /// `"PUT /v1/session"`.
    pub fn requests_of(&self, kind: &str) -> u64 {
        self.kinds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(kind)
            .copied()
            .unwrap_or(0)
    }

    /// Closes every open connection through the relay at once (both sides see the socket
    /// close). New connections are relayed as before.
    pub fn cut(&self) {
        let all = std::mem::take(&mut *self.connections.lock().unwrap_or_else(|p| p.into_inner()));
        for task in all {
            task.abort();
        }
    }

    /// Holds traffic: bytes already read are kept, nothing more is forwarded in either
    /// direction and new connections are not dialled until [`release`](Self::release).
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Lets held traffic flow again.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// Arms a fault for the next request whose first bytes (in one read from the client) are
    /// `prefix`, e.g. `b"DELETE /v1/kv/"`: the request or its answer is lost and the
    /// connection closes, as when a network path dies mid-request.
    pub fn fail_next(&self, prefix: &[u8], fault: Fault) {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((prefix.to_vec(), fault));
    }

    /// How many armed faults have fired.
    pub fn faults_fired(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.cut();
    }
}

async fn wait_released(held: &mut watch::Receiver<bool>) {
    let _ = held.wait_for(|h| !*h).await;
}

async fn relay_one(
    inbound: TcpStream,
    target: SocketAddr,
    mut held: watch::Receiver<bool>,
    faults: Faults,
    fired: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    kinds: Kinds,
) {
    wait_released(&mut held).await;
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let lose_answer = Arc::new(AtomicBool::new(false));
    let up = pump(
        in_read,
        out_write,
        held.clone(),
        Up {
            faults,
            fired,
            lose_answer: lose_answer.clone(),
            requests,
            kinds,
        },
    );
    let down = pump_down(out_read, in_write, held, lose_answer);
    // Either direction closing ends the connection.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// The fault armed for a request that starts with `chunk`, taken (each fires once).
fn take_fault(faults: &Faults, chunk: &[u8]) -> Option<Fault> {
    let mut armed = faults.lock().unwrap_or_else(|p| p.into_inner());
    let at = armed
        .iter()
        .position(|(prefix, _)| chunk.starts_with(prefix))?;
    Some(armed.remove(at).1)
}

/// What the client-to-service direction counts and injects.
struct Up {
    faults: Faults,
    fired: Arc<AtomicU64>,
    /// Set when the request on its way up must lose its answer on the way down.
    lose_answer: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    kinds: Kinds,
}

/// `"<METHOD> /<first>/<second>"` of a request that starts with an HTTP request line.
fn kind_of(chunk: &[u8]) -> Option<String> {
    let line = chunk.split(|&b| b == b'\r' || b == b'?').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let (method, rest) = line.split_once(' ')?;
    let path = rest.split(' ').next()?;
    let kind: Vec<&str> = path.splitn(4, '/').take(3).collect();
    Some(format!("{method} {}", kind.join("/")))
}

const HTTP_METHODS: [&[u8]; 4] = [b"GET ", b"PUT ", b"POST ", b"DELETE "];

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: watch::Receiver<bool>,
    up: Up,
) {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        wait_released(&mut held).await;
        if HTTP_METHODS.iter().any(|m| buf[..n].starts_with(m)) {
            up.requests.fetch_add(1, Ordering::Relaxed);
            if let Some(kind) = kind_of(&buf[..n]) {
                *up.kinds
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(kind)
                    .or_default() += 1;
            }
        }
        match take_fault(&up.faults, &buf[..n]) {
            Some(Fault::LoseRequest) => {
                up.fired.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Some(Fault::LoseAnswer) => {
                up.fired.fetch_add(1, Ordering::SeqCst);
                up.lose_answer.store(true, Ordering::SeqCst);
            }
            None => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The service-to-client direction: like [`pump`], but once an answer must be lost, the next
/// bytes from the service (its answer) are dropped and the connection closes.
async fn pump_down(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: watch::Receiver<bool>,
    lose_answer: Arc<AtomicBool>,
) {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if lose_answer.load(Ordering::SeqCst) {
            return;
        }
        wait_released(&mut held).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kind_of;

    #[test]
    fn a_request_kind_is_its_method_and_first_two_path_segments() {
        let kind = |s: &str| kind_of(s.as_bytes());
        assert_eq!(
            kind("PUT /v1/txn HTTP/1.1\r\nhost: x\r\n").as_deref(),
            Some("PUT /v1/txn")
        );
        assert_eq!(
            kind("GET /v1/kv/p/g/t/?recurse=true&index=5 HTTP/1.1\r\n").as_deref(),
            Some("GET /v1/kv")
        );
        assert_eq!(
            kind("PUT /v1/session/renew/abc HTTP/1.1\r\n").as_deref(),
            Some("PUT /v1/session")
        );
    }
}
