//! A TCP relay for fault injection: put it between a client and a real service, then cut
//! every connection through it, hold traffic (new connections wait, bytes stop flowing) and
//! let it go again, or fail the next request that starts with given bytes (for a text
//! protocol such as Consul's HTTP API): lose it on the way, or lose its answer after the
//! service acted on it, once or for every request that carries given bytes; or stop listening altogether (connects refused, as when the service's
//! host is gone) and listen on the same port again. Listens on loopback only.

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

/// Faults armed for requests: each `Once` fires for the next request that starts with its
/// bytes; each `Every` for every bytes read from a client that contain its bytes, until
/// [`Relay::stop_failing`].
type Faults = Arc<Mutex<Vec<(Armed, Fault)>>>;

#[derive(Debug)]
enum Armed {
    Once(Vec<u8>),
    Every(Vec<u8>),
}

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
    /// The task that owns the listener; `None` while [`Relay::close`]d.
    acceptor: Mutex<Option<JoinHandle<()>>>,
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
        let relay = Relay {
            addr,
            target,
            held,
            faults: Arc::default(),
            fired: Arc::new(AtomicU64::new(0)),
            connections: Arc::default(),
            accepted: Arc::new(AtomicU64::new(0)),
            requests: Arc::new(AtomicU64::new(0)),
            kinds: Arc::default(),
            acceptor: Mutex::new(None),
        };
        relay.accept_on(listener);
        Ok(relay)
    }

    /// Starts the task that accepts on `listener` and relays each connection.
    fn accept_on(&self, listener: TcpListener) {
        let target = self.target;
        let kinds = self.kinds.clone();
        let held = self.held.clone();
        let connections = self.connections.clone();
        let accepted = self.accepted.clone();
        let (faults, fired, requests) = (
            self.faults.clone(),
            self.fired.clone(),
            self.requests.clone(),
        );
        let acceptor = tokio::spawn(async move {
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
        });
        let previous = self
            .acceptor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(acceptor);
        if let Some(previous) = previous {
            previous.abort();
        }
    }

    /// Stops the relay and waits until its listening socket and every connection through it
    /// are closed: a fixed port is free again when this returns (dropping the relay frees it
    /// only once the runtime has run the tasks' cancellation).
    pub async fn stop(self) {
        let acceptor = self
            .acceptor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let connections =
            std::mem::take(&mut *self.connections.lock().unwrap_or_else(|p| p.into_inner()));
        for task in acceptor.into_iter().chain(connections) {
            task.abort();
            let _ = task.await;
        }
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
            .push((Armed::Once(prefix.to_vec()), fault));
    }

    /// Arms a standing fault: every read from a client whose bytes contain `needle` (a
    /// request line, a header or a body, e.g. one Consul key) fails as `fault` says, until
    /// [`stop_failing`](Self::stop_failing). [`faults_fired`](Self::faults_fired) counts
    /// each.
    pub fn fail_every(&self, needle: &[u8], fault: Fault) {
        assert!(!needle.is_empty(), "a standing fault needs bytes to match");
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((Armed::Every(needle.to_vec()), fault));
    }

    /// Disarms every standing fault ([`fail_every`](Self::fail_every)).
    pub fn stop_failing(&self) {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(armed, _)| matches!(armed, Armed::Once(_)));
    }

    /// Stops listening and closes every open connection through the relay, and returns once
    /// both are gone: from now on a connect to [`addr`](Self::addr) is refused (as when the
    /// service's host is gone, where [`hold`](Self::hold) is a network that stops carrying
    /// bytes), until [`reopen`](Self::reopen).
    pub async fn close(&self) {
        let acceptor = self
            .acceptor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(acceptor) = acceptor {
            acceptor.abort();
            let _ = acceptor.await;
        }
        let all = std::mem::take(&mut *self.connections.lock().unwrap_or_else(|p| p.into_inner()));
        for task in all {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens on the same address again after [`close`](Self::close) (an error if something
    /// else took the port meanwhile); relays as before. Does nothing while listening.
    pub async fn reopen(&self) -> std::io::Result<()> {
        let listening = self
            .acceptor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !listening {
            self.accept_on(TcpListener::bind(self.addr).await?);
        }
        Ok(())
    }

    /// How many armed faults have fired.
    pub fn faults_fired(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(acceptor) = self
            .acceptor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            acceptor.abort();
        }
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

/// The fault armed for `chunk`: a standing one whose bytes it contains, or else a one-shot
/// one whose bytes it starts with (taken: it fires once).
fn take_fault(faults: &Faults, chunk: &[u8]) -> Option<Fault> {
    let mut armed = faults.lock().unwrap_or_else(|p| p.into_inner());
    let standing = armed.iter().find_map(|(armed, fault)| match armed {
        Armed::Every(needle) => chunk
            .windows(needle.len())
            .any(|w| w == needle.as_slice())
            .then_some(*fault),
        Armed::Once(_) => None,
    });
    if standing.is_some() {
        return standing;
    }
    let at = armed
        .iter()
        .position(|(armed, _)| matches!(armed, Armed::Once(prefix) if chunk.starts_with(prefix)))?;
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
    use super::{kind_of, Fault, Relay};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// One round trip through `relay` to the echo service behind it.
    async fn echoes(relay: &Relay) -> std::io::Result<()> {
        let mut stream = TcpStream::connect(relay.addr()).await?;
        stream.write_all(b"ping").await?;
        let mut got = [0_u8; 4];
        stream.read_exact(&mut got).await?;
        assert_eq!(&got, b"ping");
        Ok(())
    }

    /// An echo service on a loopback port of its own.
    async fn echo_service() -> std::net::SocketAddr {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        target
    }

    /// Sends `bytes` through `relay` and reads them back: `false` when the connection
    /// closed instead.
    async fn round_trip(relay: &Relay, bytes: &[u8]) -> bool {
        let mut stream = TcpStream::connect(relay.addr()).await.expect("connect");
        stream.write_all(bytes).await.expect("write");
        let mut got = vec![0_u8; bytes.len()];
        stream.read_exact(&mut got).await.is_ok()
    }

    #[tokio::test]
    async fn a_standing_fault_fails_every_request_carrying_its_bytes_until_disarmed() {
        let relay = Relay::start(echo_service().await).await.expect("relay");
        relay.fail_every(b"~target", Fault::LoseRequest);
        for _ in 0..3 {
            assert!(!round_trip(&relay, b"PUT /v1/txn {\"Key\":\"p/g/t/~target\"}").await);
            assert!(round_trip(&relay, b"PUT /v1/txn {\"Key\":\"p/g/t/0\"}").await);
        }
        assert_eq!(relay.faults_fired(), 3);
        relay.stop_failing();
        assert!(round_trip(&relay, b"PUT /v1/txn {\"Key\":\"p/g/t/~target\"}").await);
        assert_eq!(relay.faults_fired(), 3);
    }

    #[tokio::test]
    async fn a_closed_relay_refuses_connects_until_it_reopens_on_its_port() {
        let relay = Relay::start(echo_service().await).await.expect("relay");
        let addr = relay.addr();
        echoes(&relay).await.expect("relayed");
        let mut open = TcpStream::connect(addr).await.expect("connect");
        open.write_all(b"x").await.expect("write");
        let mut buf = [0_u8; 1];
        open.read_exact(&mut buf).await.expect("relayed");
        relay.close().await;
        let refused = TcpStream::connect(addr).await.expect_err("refused");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        // The connection open at the close was closed with it.
        assert!(matches!(open.read(&mut buf).await, Ok(0) | Err(_)));
        relay.reopen().await.expect("reopen");
        assert_eq!(relay.addr(), addr);
        echoes(&relay).await.expect("relayed again");
        assert_eq!(relay.accepted(), 3);
    }

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
