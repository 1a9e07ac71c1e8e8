//! The command line tools for people: `kafka-lease leases` and `kafka-lease tail`, clients of
//! a gateway over gRPC through the Rust client crate, and `kafka-lease topics`, a client of
//! Kafka's admin API. This module holds what they share: the gateway connection flags, the
//! exit statuses, and how a failure becomes one line on stderr.

pub(crate) mod leases;
mod render;
pub(crate) mod tail;
pub(crate) mod topics;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use kafka_lease_client::{Client, ClientTls};
use tonic::Code;

/// Exit status for bad usage: a bad flag or flag value, or a file a flag names that cannot be
/// used (EX_USAGE from sysexits.h, as `serve` uses).
pub(crate) const EXIT_USAGE: u8 = 64;
/// Exit status when the gateway cannot be reached or answers UNAVAILABLE (EX_UNAVAILABLE).
pub(crate) const EXIT_UNAVAILABLE: u8 = 69;
/// Exit status when the gateway refuses the caller: UNAUTHENTICATED or PERMISSION_DENIED
/// (EX_NOPERM).
pub(crate) const EXIT_NOPERM: u8 = 77;
/// Exit status for every other gateway error.
pub(crate) const EXIT_FAILURE: u8 = 1;

/// Writes a tool's whole output to stdout: exit 0, also when the reader went away (`| head`).
pub(crate) fn print(text: &str) -> Result<u8, Failure> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(0),
        // Whoever reads the output stopped (`| head`): nothing more to say.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(Failure {
            status: EXIT_FAILURE,
            line: format!("cannot write to stdout: {e}"),
        }),
    }
}

/// How long connecting to the gateway may take before the tool gives up (exit 69).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The default gateway address.
pub(crate) const DEFAULT_GATEWAY: &str = "http://127.0.0.1:50051";

/// Where the gateway is and how to talk to it: the flags every tool takes.
#[derive(Debug, Clone, Args)]
pub(crate) struct ConnectArgs {
    /// The gateway: `host:port` (as grpcurl takes it; `[::1]:port` for an IPv6 address),
    /// plaintext unless a TLS flag is given; or a URL, `http://host:port` (plaintext) or
    /// `https://host:port` (TLS, with `--ca-cert`).
    #[arg(
        long,
        env = "KAFKA_LEASE_GATEWAY",
        default_value = DEFAULT_GATEWAY,
        value_name = "ADDRESS",
        value_parser = parse_gateway
    )]
    pub(crate) gateway: Gateway,
    /// CA certificate (PEM) the gateway's certificate must chain to: TLS. Needed for
    /// `https://` and for TLS to a `host:port`.
    #[arg(long, value_name = "PATH")]
    pub(crate) ca_cert: Option<PathBuf>,
    /// Client certificate (PEM) for a gateway that requires mutual TLS; with `--key`.
    #[arg(long, value_name = "PATH", requires = "key")]
    pub(crate) cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); with `--cert`.
    #[arg(long, value_name = "PATH", requires = "cert")]
    pub(crate) key: Option<PathBuf>,
    /// A file holding the bearer token to send (its surrounding whitespace is ignored). The
    /// token is never printed.
    #[arg(long, env = "KAFKA_LEASE_TOKEN_FILE", value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
}

/// How `--gateway` was written: its scheme, if it had one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GatewayForm {
    /// `http://host:port`: plaintext, and TLS flags are a mistake.
    Http,
    /// `https://host:port`: TLS.
    Https,
    /// `host:port`: TLS when a TLS flag is given, else plaintext.
    HostPort,
}

/// `--gateway`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gateway {
    /// As given, for messages.
    pub(crate) given: String,
    /// `host:port` (or `host` for a URL without a port).
    pub(crate) authority: String,
    pub(crate) form: GatewayForm,
}

impl std::fmt::Display for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.given)
    }
}

/// `--gateway`: `host:port`, `[v6]:port`, or an `http://` or `https://` URL with a host (and
/// usually a port) and no path.
fn parse_gateway(value: &str) -> Result<Gateway, String> {
    let allowed = "allowed: host:port, [IPv6 address]:port, http://host:port or https://host:port";
    let (form, authority) = if let Some(rest) = value.strip_prefix("http://") {
        (GatewayForm::Http, rest.strip_suffix('/').unwrap_or(rest))
    } else if let Some(rest) = value.strip_prefix("https://") {
        (GatewayForm::Https, rest.strip_suffix('/').unwrap_or(rest))
    } else if value.contains("://") {
        return Err(format!(
            "{value:?} has a scheme other than http:// or https://; {allowed}"
        ));
    } else {
        (GatewayForm::HostPort, value)
    };
    let not_an_address = || format!("{value:?} is not a gateway address; {allowed}");
    if authority.is_empty() || authority.contains(['/', '@', '?', '#']) {
        return Err(not_an_address());
    }
    let uri = format!("http://{authority}")
        .parse::<tonic::transport::Uri>()
        .map_err(|_| not_an_address())?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(not_an_address());
    }
    if form == GatewayForm::HostPort && uri.port().is_none() {
        return Err(format!("{value:?} has no port; {allowed}"));
    }
    Ok(Gateway {
        given: value.to_string(),
        authority: authority.to_string(),
        form,
    })
}

/// Why a tool stops with a non-zero status: the status and the line for stderr.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: u8,
    pub(crate) line: String,
}

impl Failure {
    /// Bad usage (exit 64).
    pub(crate) fn usage(line: impl Into<String>) -> Failure {
        Failure {
            status: EXIT_USAGE,
            line: line.into(),
        }
    }

    /// A gateway error or a connection failure: the gRPC code, the gateway's reason where it
    /// gave one, and its message, on one line.
    pub(crate) fn gateway(err: &kafka_lease_client::Error) -> Failure {
        let code = err.code();
        let status = exit_status(code);
        let reason = err
            .reason()
            .map(|r| format!(" ({})", r.as_str()))
            .unwrap_or_default();
        let message = match err {
            kafka_lease_client::Error::Transport(source) => {
                format!("cannot reach the gateway: {}", error_chain(source))
            }
            other => other.message(),
        };
        Failure {
            status,
            line: format!("{}{reason}: {}", code_name(code), one_line(&message)),
        }
    }
}

/// The exit status of a gateway error with this gRPC code.
pub(crate) fn exit_status(code: Code) -> u8 {
    match code {
        Code::Unavailable => EXIT_UNAVAILABLE,
        Code::Unauthenticated | Code::PermissionDenied => EXIT_NOPERM,
        _ => EXIT_FAILURE,
    }
}

/// The canonical name of a gRPC code, as the gRPC specification and grpcurl spell it.
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// An error and its sources, `outer: inner: …`, with repeats left out (tonic's transport
/// error says "transport error" at two levels).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// `text` on one line: line breaks become spaces.
pub(crate) fn one_line(text: &str) -> String {
    text.split(['\r', '\n'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A clap usage error as one line: its message and what is allowed, without the usage block
/// and the pointer to `--help`.
pub(crate) fn usage_line(err: &clap::Error) -> String {
    let text = err.render().to_string();
    let mut parts = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if !line.is_empty() {
            parts.push(line);
        }
    }
    let joined = parts.join(" ");
    joined
        .strip_prefix("error: ")
        .unwrap_or(&joined)
        .to_string()
}

/// Reads a file a flag names; a failure is bad usage naming the flag and the file (never its
/// contents).
fn read_flag_file(flag: &str, path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path)
        .map_err(|e| Failure::usage(format!("{flag} {}: cannot read it ({e})", path.display())))
}

/// Checks the connection flags against each other and reads the files they name, before
/// anything is connected.
pub(crate) fn connection(args: &ConnectArgs) -> Result<Connection, Failure> {
    let gateway = &args.gateway;
    let tls_flag = [
        ("--ca-cert", args.ca_cert.is_some()),
        ("--cert", args.cert.is_some()),
        ("--key", args.key.is_some()),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag));
    let tls = match (gateway.form, tls_flag) {
        (GatewayForm::Https, _) | (GatewayForm::HostPort, Some(_)) => {
            let Some(ca) = &args.ca_cert else {
                let why = match tls_flag {
                    Some(flag) if gateway.form == GatewayForm::HostPort => {
                        format!("{flag} means TLS, and TLS")
                    }
                    _ => format!("--gateway {gateway}"),
                };
                return Err(Failure::usage(format!(
                    "{why} needs --ca-cert: the CA certificate (PEM) the gateway's \
                     certificate chains to"
                )));
            };
            let mut tls = ClientTls::new(read_flag_file("--ca-cert", ca)?);
            if let (Some(cert), Some(key)) = (&args.cert, &args.key) {
                tls = tls.client_certificate(
                    read_flag_file("--cert", cert)?,
                    read_flag_file("--key", key)?,
                );
            }
            Some(tls)
        }
        (GatewayForm::Http, Some(flag)) => {
            return Err(Failure::usage(format!(
                "{flag} is for TLS, but --gateway {gateway} is plaintext; use an https:// \
                 gateway or host:port"
            )));
        }
        (GatewayForm::Http | GatewayForm::HostPort, None) => None,
    };
    let token = match &args.token_file {
        None => None,
        Some(path) => {
            let bytes = read_flag_file("--token-file", path)?;
            let token = String::from_utf8(bytes)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
                .ok_or_else(|| {
                    Failure::usage(format!(
                        "--token-file {}: allowed one token of visible ASCII characters \
                         (surrounding whitespace ignored)",
                        path.display()
                    ))
                })?;
            Some(token)
        }
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    Ok(Connection {
        endpoint: format!("{scheme}://{}", gateway.authority),
        tls,
        token,
    })
}

/// Everything needed to connect, checked and read. Its `Debug` never shows the token.
pub(crate) struct Connection {
    /// The URL connected to: `http://` or `https://` and the gateway's `host:port`.
    endpoint: String,
    tls: Option<ClientTls>,
    token: Option<String>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("endpoint", &self.endpoint)
            .field("tls", &self.tls)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Connection {
    /// Connects, within [`CONNECT_TIMEOUT`]. A failure to connect names the address tried.
    pub(crate) async fn connect(&self) -> Result<Client, Failure> {
        let connecting = async {
            match &self.tls {
                Some(tls) => Client::connect_tls(self.endpoint.clone(), tls).await,
                None => Client::connect(self.endpoint.clone()).await,
            }
        };
        let unreachable = |why: String| Failure {
            status: EXIT_UNAVAILABLE,
            line: format!(
                "UNAVAILABLE: cannot reach the gateway at {}: {}",
                self.endpoint,
                one_line(&why)
            ),
        };
        let client = match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(kafka_lease_client::Error::Transport(source))) => {
                return Err(unreachable(error_chain(&source)))
            }
            Ok(Err(err)) => return Err(Failure::gateway(&err)),
            Err(_) => {
                return Err(unreachable(format!(
                    "no connection within {}s",
                    CONNECT_TIMEOUT.as_secs()
                )))
            }
        };
        match &self.token {
            None => Ok(client),
            Some(token) => client
                .with_bearer_token(token)
                .map_err(|_| Failure::usage("--token-file: the token is not a valid header value")),
        }
    }
}

/// A current-thread runtime for a tool (they do one thing at a time).
fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure {
            status: EXIT_FAILURE,
            line: format!("cannot start the runtime: {e}"),
        })
}

/// Runs a tool on a runtime of its own to its exit status, printing its failure (if any)
/// as one line on stderr prefixed with `kafka-lease <tool>:`.
pub(crate) fn run(tool: &str, work: impl Future<Output = Result<u8, Failure>>) -> ExitCode {
    let result = runtime().and_then(|runtime| {
        let result = runtime.block_on(work);
        // A write to stdout that a signal cut short may still block a thread of the runtime
        // (a reader that stopped reading): do not wait for it.
        runtime.shutdown_background();
        result
    });
    match result {
        Ok(status) => ExitCode::from(status),
        Err(failure) => {
            eprintln!("kafka-lease {tool}: {}", failure.line);
            ExitCode::from(failure.status)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways_are_host_port_or_urls() {
        for (ok, authority, form) in [
            ("127.0.0.1:50051", "127.0.0.1:50051", GatewayForm::HostPort),
            ("[::1]:50051", "[::1]:50051", GatewayForm::HostPort),
            ("gw.example:443", "gw.example:443", GatewayForm::HostPort),
            (
                "http://127.0.0.1:50051",
                "127.0.0.1:50051",
                GatewayForm::Http,
            ),
            (
                "https://gw.example:443",
                "gw.example:443",
                GatewayForm::Https,
            ),
            ("http://[::1]:50051/", "[::1]:50051", GatewayForm::Http),
            ("http://localhost", "localhost", GatewayForm::Http),
        ] {
            let gateway = parse_gateway(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert_eq!(gateway.authority, authority, "{ok}");
            assert_eq!(gateway.form, form, "{ok}");
            assert_eq!(gateway.to_string(), ok);
        }
        for bad in [
            "127.0.0.1",
            "[::1]",
            "::1:50051",
            ":50051",
            "grpc://x:1",
            "http://",
            "http:///x",
            "http://a:1/path",
            "a:1/path",
            "user@a:1",
            "",
        ] {
            let err = parse_gateway(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(
                err.contains("allowed: host:port, [IPv6 address]:port, http://host:port"),
                "{err}"
            );
        }
    }

    #[test]
    fn exit_statuses_follow_the_code() {
        assert_eq!(exit_status(Code::Unavailable), 69);
        assert_eq!(exit_status(Code::PermissionDenied), 77);
        assert_eq!(exit_status(Code::Unauthenticated), 77);
        assert_eq!(exit_status(Code::NotFound), 1);
        assert_eq!(exit_status(Code::ResourceExhausted), 1);
    }

    #[test]
    fn a_gateway_error_is_one_line_with_the_code_and_the_reason() {
        let status = tonic::Status::new(Code::NotFound, "topic \"x\" does not exist\nat all");
        let failure = Failure::gateway(&kafka_lease_client::Error::from(status));
        assert_eq!(failure.status, 1);
        assert_eq!(failure.line, "NOT_FOUND: topic \"x\" does not exist at all");
    }

    fn connect_args(gateway: &str) -> ConnectArgs {
        ConnectArgs {
            gateway: parse_gateway(gateway).expect("a gateway"),
            ca_cert: None,
            cert: None,
            key: None,
            token_file: None,
        }
    }

    #[test]
    fn tls_flags_must_match_the_scheme() {
        let err = connection(&connect_args("https://gw:1")).expect_err("no CA");
        assert_eq!(err.status, EXIT_USAGE);
        assert!(err.line.contains("needs --ca-cert"), "{}", err.line);
        let mut args = connect_args("http://gw:1");
        args.ca_cert = Some("ca.pem".into());
        let err = connection(&args).expect_err("CA on plaintext");
        assert!(err.line.starts_with("--ca-cert is for TLS"), "{}", err.line);
        // host:port: plaintext, or TLS with a TLS flag (which then needs the CA).
        let conn = connection(&connect_args("gw:1")).expect("plaintext");
        assert_eq!(conn.endpoint, "http://gw:1");
        assert!(conn.tls.is_none());
        let conn = connection(&connect_args("[::1]:1")).expect("plaintext");
        assert_eq!(conn.endpoint, "http://[::1]:1");
        let mut args = connect_args("gw:1");
        args.cert = Some("c.pem".into());
        args.key = Some("k.pem".into());
        let err = connection(&args).expect_err("a client certificate without a CA");
        assert_eq!(err.status, EXIT_USAGE);
        assert!(
            err.line
                .starts_with("--cert means TLS, and TLS needs --ca-cert"),
            "{}",
            err.line
        );
        let dir = std::env::temp_dir().join(format!("kafka-lease-tools-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, "not checked before connecting").expect("write");
        let mut args = connect_args("gw:1");
        args.ca_cert = Some(ca.clone());
        let conn = connection(&args).expect("TLS");
        assert_eq!(conn.endpoint, "https://gw:1");
        assert!(conn.tls.is_some());
        let mut args = connect_args("https://gw:1/");
        args.ca_cert = Some(ca);
        assert_eq!(connection(&args).expect("TLS").endpoint, "https://gw:1");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_token_file_is_read_and_never_shown() {
        let dir = std::env::temp_dir().join(format!("kafka-lease-tools-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let good = dir.join("token");
        std::fs::write(&good, "  s3cr3t-token-value \n").expect("write");
        let mut args = connect_args("http://gw:1");
        args.token_file = Some(good);
        let conn = connection(&args).expect("token");
        assert_eq!(conn.token.as_deref(), Some("s3cr3t-token-value"));
        assert!(!format!("{conn:?}").contains("s3cr3t"));
        let bad = dir.join("bad-token");
        std::fs::write(&bad, "two s3cr3t words").expect("write");
        args.token_file = Some(bad);
        let err = connection(&args).expect_err("bad token");
        assert_eq!(err.status, EXIT_USAGE);
        assert!(!err.line.contains("s3cr3t"), "{}", err.line);
        args.token_file = Some(dir.join("missing"));
        let err = connection(&args).expect_err("missing");
        assert!(err.line.starts_with("--token-file "), "{}", err.line);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
