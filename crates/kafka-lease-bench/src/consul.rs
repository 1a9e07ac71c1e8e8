//! Talking to Consul without the gateway: a minimal HTTP/1.1 keep-alive client over one
//! `TcpStream` (the raw baseline of the acquire-release scenario, and the Raft index that
//! counts writes), and a counting TCP proxy that tallies the HTTP requests a gateway sends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// `host:port` of an `http://host:port` address.
pub(crate) fn host_port(http_addr: &str) -> String {
    http_addr
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string()
}

/// One keep-alive HTTP/1.1 connection to Consul.
#[derive(Debug)]
pub(crate) struct RawConsul {
    addr: String,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

/// A response: status code and body.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

impl Response {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }
}

impl RawConsul {
    pub(crate) fn new(http_addr: &str) -> Self {
        Self {
            addr: host_port(http_addr),
            stream: None,
            buf: Vec::new(),
        }
    }

    /// Sends one request and reads its response; reconnects once if the kept-alive
    /// connection was closed.
    pub(crate) async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<Response> {
        match self.try_request(method, path, body).await {
            Ok(r) => Ok(r),
            Err(_) => {
                self.stream = None;
                self.buf.clear();
                self.try_request(method, path, body).await
            }
        }
    }

    async fn try_request(&mut self, method: &str, path: &str, body: &[u8]) -> Result<Response> {
        if self.stream.is_none() {
            let s = TcpStream::connect(&self.addr)
                .await
                .with_context(|| format!("connecting to Consul at {}", self.addr))?;
            s.set_nodelay(true)?;
            self.stream = Some(s);
            self.buf.clear();
        }
        let stream = self
            .stream
            .as_mut()
            .ok_or_else(|| anyhow!("no connection"))?;
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        stream.write_all(&request).await?;
        read_response(stream, &mut self.buf).await
    }

    /// Consul's Raft `last_log_index` (`/v1/agent/self`, `Stats.raft`): grows by one per
    /// write committed through Raft (KV writes, session create/destroy, catalog updates...).
    /// Session renewals are not Raft writes.
    pub(crate) async fn raft_index(&mut self) -> Result<u64> {
        let r = self.request("GET", "/v1/agent/self", b"").await?;
        if r.status != 200 {
            bail!("GET /v1/agent/self: {} {}", r.status, r.text());
        }
        let v: serde_json::Value =
            serde_json::from_slice(&r.body).context("parsing /v1/agent/self")?;
        v.pointer("/Stats/raft/last_log_index")
            .and_then(|x| x.as_str())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("/v1/agent/self has no Stats.raft.last_log_index"))
    }

    /// Creates a session (`Behavior=delete`, like the gateway's) and returns its id.
    pub(crate) async fn create_session(&mut self, name: &str, ttl: &str) -> Result<String> {
        let body =
            serde_json::json!({"Name": name, "TTL": ttl, "Behavior": "delete", "LockDelay": "1s"});
        let r = self
            .request("PUT", "/v1/session/create", body.to_string().as_bytes())
            .await?;
        if r.status != 200 {
            bail!("session create: {} {}", r.status, r.text());
        }
        let v: serde_json::Value = serde_json::from_slice(&r.body)?;
        v.get("ID")
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(|| anyhow!("session create answered {}", r.text()))
    }
}

async fn fill_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<()> {
    let mut chunk = [0_u8; 16 * 1024];
    let n = stream.read(&mut chunk).await?;
    if n == 0 {
        bail!("connection closed");
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads one response (Content-Length or chunked body) from `stream`, with `buf` holding
/// bytes already read past the previous response.
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Response> {
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i;
        }
        fill_more(stream, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    buf.drain(..head_end + 4);
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line in {head:?}"))?;
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = find(buf, b"\r\n") {
                    break i;
                }
                fill_more(stream, buf).await?;
            };
            let size_text = String::from_utf8_lossy(&buf[..line_end]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .with_context(|| format!("bad chunk size {size_text:?}"))?;
            buf.drain(..line_end + 2);
            while buf.len() < size + 2 {
                fill_more(stream, buf).await?;
            }
            body.extend_from_slice(&buf[..size]);
            buf.drain(..size + 2);
            if size == 0 {
                break;
            }
        }
        body
    } else {
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < len {
            fill_more(stream, buf).await?;
        }
        buf.drain(..len).collect()
    };
    Ok(Response { status, body })
}

/// What kind of Consul request a method and path are, e.g. `PUT kv ?acquire`,
/// `GET kv ?index (blocking)`, `PUT session/renew`.
pub(crate) fn classify(method: &str, target: &str) -> String {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let rest = path.trim_start_matches("/v1/");
    let mut segments = rest.split('/');
    let first = segments.next().unwrap_or("");
    let what = match first {
        "kv" => "kv".to_string(),
        "session" | "agent" | "status" | "catalog" | "health" | "txn" => match segments.next() {
            Some(second) if !second.is_empty() => format!("{first}/{second}"),
            _ => first.to_string(),
        },
        other => other.to_string(),
    };
    let mut flags: Vec<&str> = query
        .split('&')
        .filter_map(|kv| kv.split('=').next())
        .filter(|k| {
            matches!(
                *k,
                "acquire" | "release" | "cas" | "index" | "consistent" | "recurse" | "keys"
            )
        })
        .collect();
    flags.sort_unstable();
    if flags.is_empty() {
        format!("{method} {what}")
    } else {
        format!("{method} {what} ?{}", flags.join("&?"))
    }
}

/// Whether a request of this class changes Consul state (an HTTP write).
pub(crate) fn is_write(class: &str) -> bool {
    class.starts_with("PUT ") || class.starts_with("POST ") || class.starts_with("DELETE ")
}

/// Request counts by [`classify`] class.
pub(crate) type Counts = BTreeMap<String, u64>;

/// A TCP proxy on 127.0.0.1 in front of Consul that counts each HTTP request by class.
#[derive(Debug)]
pub(crate) struct CountingProxy {
    pub(crate) http_addr: String,
    counts: Arc<Mutex<Counts>>,
    accept: JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl CountingProxy {
    pub(crate) async fn start(consul_http_addr: &str) -> Result<CountingProxy> {
        let upstream = host_port(consul_http_addr);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let local = listener.local_addr()?;
        let counts: Arc<Mutex<Counts>> = Arc::default();
        let counts_task = counts.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let counts = counts_task.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let down = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                    });
                    let _ = forward_requests(&mut client_read, &mut server_write, &counts).await;
                    down.abort();
                });
            }
        });
        Ok(CountingProxy {
            http_addr: format!("http://{local}"),
            counts,
            accept,
        })
    }

    /// The counts so far.
    pub(crate) fn snapshot(&self) -> Counts {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The difference `after - before`, per class, leaving out zeros.
pub(crate) fn diff(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Copies requests from the client to Consul, parsing each request head (and skipping its
/// Content-Length body) to count it. A request it cannot parse (chunked upload) is counted
/// as `unparsed` and the rest of the connection is copied without counting.
async fn forward_requests(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    counts: &Mutex<Counts>,
) -> Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0_u8; 16 * 1024];
    loop {
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i;
            }
            let n = from.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut words = head.split_whitespace();
        let method = words.next().unwrap_or("?").to_string();
        let target = words.next().unwrap_or("?").to_string();
        let header = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_string())
            })
        };
        let chunked = header("transfer-encoding").is_some();
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        {
            let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
            let class = if chunked {
                "unparsed".to_string()
            } else {
                classify(&method, &target)
            };
            *c.entry(class).or_insert(0) += 1;
        }
        if chunked {
            to.write_all(&buf).await?;
            tokio::io::copy(from, to).await?;
            return Ok(());
        }
        let total = head_end + 4 + len;
        while buf.len() < total {
            let n = from.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        to.write_all(&buf[..total]).await?;
        buf.drain(..total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classified() {
        assert_eq!(
            classify("PUT", "/v1/kv/p/g/t/0?acquire=abc"),
            "PUT kv ?acquire"
        );
        assert_eq!(
            classify("GET", "/v1/kv/p/g/t/?index=5&keys=&wait=9s"),
            "GET kv ?index&?keys"
        );
        assert_eq!(
            classify("PUT", "/v1/session/renew/abc-def"),
            "PUT session/renew"
        );
        assert_eq!(classify("DELETE", "/v1/kv/p/x?cas=7"), "DELETE kv ?cas");
        assert_eq!(classify("GET", "/v1/status/leader"), "GET status/leader");
        assert!(is_write("PUT session/renew"));
        assert!(!is_write("GET kv ?consistent"));
    }

    #[test]
    fn diffs_drop_zeros() {
        let before: Counts = [("a".to_string(), 2), ("b".to_string(), 1)].into();
        let after: Counts = [
            ("a".to_string(), 5),
            ("b".to_string(), 1),
            ("c".to_string(), 1),
        ]
        .into();
        let d = diff(&after, &before);
        assert_eq!(d.get("a"), Some(&3));
        assert_eq!(d.get("b"), None);
        assert_eq!(d.get("c"), Some(&1));
    }
}
