//! The `kafka-lease` binary: parses the configuration, sets up logging, and runs the gateway
//! (`serve`) or the self-contained demo (`dev`) until SIGTERM or SIGINT; or runs one of the
//! command line tools for people (`leases` and `tail`, which talk to a gateway, and `topics`,
//! which talks to Kafka; in `tools/`).

mod tools;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kafka_lease_server::auth::Auth;
use kafka_lease_server::config::{default_instance_id, DevArgs, LogArgs, LogFormat, ServeArgs};
use kafka_lease_server::coordination::consul::ConsulLocks;
use kafka_lease_server::coordination::memory::MemoryLockStore;
use kafka_lease_server::dev::{DevKafka, DEMO_PARTITIONS, DEMO_TOPIC};
use kafka_lease_server::gateway::{Gateway, Limits};
use kafka_lease_server::kafka::{Kafka, DEFAULT_MAX_GROUPS};
use kafka_lease_server::server::ServeOptions;
use kafka_lease_server::tls::ServerTls;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// jemalloc, for Rust's allocations and, unprefixed, for every C library linked in: librdkafka
/// allocates and frees an operation, a message and a header list per record it delivers, and
/// glibc's malloc served those slowly (a 100-byte drain used 0.71 us of the gateway's CPU per
/// record with it, 0.55 with jemalloc; docs/BENCHMARKS.md). Its options (small per-thread
/// caches: a gateway with many groups runs hundreds of librdkafka threads) are built in from
/// `.cargo/config.toml`; `MALLOC_CONF` in the environment overrides them.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The version and the git revision this binary was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("KAFKA_LEASE_GIT_REVISION"),
    ")"
);

/// Exit status for a bad configuration (EX_USAGE from sysexits.h).
const EXIT_USAGE: u8 = 64;

/// kafka-lease: lease Kafka partitions to consumer-group clients in any language over gRPC,
/// with partition ownership coordinated through Consul locks.
#[derive(Debug, Parser)]
#[command(name = "kafka-lease", version = VERSION, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway against a real Kafka cluster and a real Consul agent.
    Serve(Box<ServeArgs>),
    /// Run a self-contained gateway: an in-process Kafka (librdkafka's mock cluster) with a
    /// topic `demo` of 4 partitions holding sample records, and in-memory locks. Needs
    /// nothing installed; for trying the API, not for production.
    Dev(DevArgs),
    /// Show who holds which partition leases, across every gateway instance.
    Leases(tools::leases::LeasesArgs),
    /// Lease a partition and print its records to stdout; on exit (SIGINT: status 130,
    /// SIGTERM: 143, --max-records reached or --exit-at-end at the partition's end: 0)
    /// commit if asked and release the lease.
    Tail(Box<tools::tail::TailArgs>),
    /// Create, list, describe or delete topics through Kafka's admin API (this one talks to
    /// Kafka itself, with the gateway's Kafka flags). Exit status: 0 done, 1 Kafka refused
    /// (the topic exists, does not exist, an invalid name or setting), 64 bad usage, 69
    /// Kafka unreachable, 77 not authorized.
    Topics(tools::topics::TopicsArgs),
}

/// The subcommands that run a gateway.
enum GatewayCommand {
    Serve(Box<ServeArgs>),
    Dev(DevArgs),
}

/// The subcommand named on the command line, if it is one of the tools: their usage errors
/// are printed on one line.
fn tool_named_in_args() -> Option<&'static str> {
    let first = std::env::args_os().nth(1)?;
    ["leases", "tail", "topics"]
        .into_iter()
        .find(|tool| first.to_str() == Some(tool))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let usage_error = err.use_stderr();
            if let (true, Some(tool)) = (usage_error, tool_named_in_args()) {
                eprintln!("kafka-lease {tool}: {}", tools::usage_line(&err));
            } else {
                let _ = err.print();
            }
            return if usage_error {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let mut command = match cli.command {
        Command::Serve(args) => GatewayCommand::Serve(args),
        Command::Dev(args) => GatewayCommand::Dev(args),
        Command::Leases(args) => return tools::run("leases", tools::leases::run(args)),
        Command::Tail(args) => return tools::run("tail", tools::tail::run(*args)),
        Command::Topics(args) => return tools::run("topics", tools::topics::run(args)),
    };
    if let GatewayCommand::Serve(args) = &command {
        if let Err(err) = args.validate() {
            eprintln!("kafka-lease: {err}");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // librdkafka's blocking calls (metadata, commits, seeks) run here; a cap keeps the
        // thread count bounded under load instead of growing to tokio's default of 512.
        .max_blocking_threads(16)
        .thread_name("kafka-lease")
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("kafka-lease: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // The instance id is fixed here, so that the traces' resource names the instance the
    // logs and Consul name.
    let (log, instance) = match &mut command {
        GatewayCommand::Serve(args) => {
            let instance = args
                .instance_id
                .get_or_insert_with(default_instance_id)
                .clone();
            (&args.log, instance)
        }
        GatewayCommand::Dev(args) => (&args.log, "dev".to_string()),
    };
    // The OTLP exporter's gRPC channel lives on the runtime.
    let traces = {
        let _runtime = runtime.enter();
        match init_logging(log, &instance) {
            Ok(traces) => traces,
            Err(err) => {
                eprintln!("kafka-lease: {err:#}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    };
    let result = runtime.block_on(async {
        match command {
            GatewayCommand::Serve(args) => serve(*args).await,
            GatewayCommand::Dev(args) => dev(args).await,
        }
    });
    if let Some(traces) = traces {
        // Sends the spans still buffered.
        let _runtime = runtime.enter();
        if let Err(err) = traces.shutdown() {
            eprintln!("kafka-lease: flushing traces: {err}");
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Said once: in the log where the log shows errors, else on its own line.
            if tracing::enabled!(tracing::Level::ERROR) {
                tracing::error!("{err:#}");
            } else {
                eprintln!("kafka-lease: {err:#}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Logging to stderr, and with `--otlp-endpoint` the span exporter (returned, to be flushed
/// at exit).
fn init_logging(log: &LogArgs, instance: &str) -> anyhow::Result<Option<SdkTracerProvider>> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let mut filter = tracing_subscriber::EnvFilter::try_new(&log.log)
        .with_context(|| format!("invalid --log filter {:?}", log.log))?;
    // The Consul client logs every request at info, and every failed one (expected 404s
    // too) at error with no context, before the gateway says what failed and why: silent
    // unless the filter names it.
    for noisy in ["consulrs", "rustify"] {
        if !log.log.contains(noisy) {
            if let Ok(directive) = format!("{noisy}=off").parse() {
                filter = filter.add_directive(directive);
            }
        }
    }
    // Colour only for a person at a terminal: a file or a pipe gets plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let fmt = match log.log_format {
        LogFormat::Pretty => fmt.boxed(),
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .boxed(),
    };
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let traces = match &log.otlp_endpoint {
        None => None,
        Some(endpoint) => {
            use opentelemetry_otlp::WithExportConfig as _;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .build()
                .with_context(|| format!("invalid --otlp-endpoint {endpoint:?}"))?;
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name("kafka-lease")
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.instance.id",
                    instance.to_string(),
                ))
                .with_attribute(opentelemetry::KeyValue::new("service.version", VERSION))
                .build();
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            )
        }
    };
    let otel = traces.as_ref().map(|provider| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer().with_tracer(provider.tracer("kafka-lease"))
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .init();
    Ok(traces)
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let instance = args.instance();
    // TLS material and the policy are read before anything is bound: a bad file is a
    // startup error naming it.
    let tls = match args.security.tls_files() {
        Some(files) => Some(Arc::new(ServerTls::load(files).context("TLS")?)),
        None => None,
    };
    let auth = Arc::new(
        Auth::load(&args.security.auth_files(), tls.clone())
            .map_err(anyhow::Error::msg)
            .context("authorization")?,
    );
    tracing::info!(
        tls = tls.is_some(),
        mutual_tls = tls.as_ref().is_some_and(|t| t.mutual()),
        identity = tls
            .as_ref()
            .and_then(|t| t.own_identity())
            .as_deref()
            .unwrap_or("-"),
        policy = auth.enforcing(),
        reflection = args.security.reflection,
        "transport security"
    );
    tracing::info!(version = VERSION, %instance, listen = %args.listen, kafka = %args.kafka, consul = %args.consul, "starting kafka-lease");
    // validate() read the file before logging was set up; this is the read that counts.
    let kafka_properties = args.kafka_properties()?;
    // Which properties the operator set, secret values as `***`.
    match &args.kafka_config_file {
        Some(file) => tracing::info!(
            properties = %kafka_properties.redacted(),
            file = %file.display(),
            "Kafka client properties set by --kafka-config and --kafka-config-file"
        ),
        None => tracing::info!(
            properties = %kafka_properties.redacted(),
            "Kafka client properties set by --kafka-config"
        ),
    }
    let metrics = match args.metrics_listen {
        Some(addr) => Some((
            kafka_lease_server::metrics::install()?,
            kafka_lease_server::metrics_endpoint::bind(addr).await?,
        )),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let bound = listener.local_addr()?;
    let advertise = args.advertise(bound)?;
    let locks = connect_consul(&args, &instance, bound).await?;
    let kafka = Kafka::new(args.kafka_settings(&instance, kafka_properties))?;
    let gateway = Gateway::serving(
        instance,
        Some(advertise.clone()),
        Arc::new(locks),
        kafka,
        args.limits(),
    );
    let addr = listener.local_addr()?;
    if let Some((handle, metrics_listener)) = metrics {
        let metrics_addr = metrics_listener.local_addr()?;
        tracing::info!(endpoint = %format!("http://{metrics_addr}/metrics"), "serving metrics");
        tokio::spawn(kafka_lease_server::metrics_endpoint::serve(
            metrics_listener,
            handle,
            gateway.clone(),
        ));
    }
    tracing::info!(%addr, %advertise, "serving");
    // One machine-readable line on stdout, for scripts and tests started with port 0.
    println!("kafka-lease listening on {addr}");
    let options = args.serve_options(tls, auth)?;
    kafka_lease_server::server::serve(listener, gateway, shutdown_signal(), options).await?;
    Ok(())
}

/// How long a starting gateway waits for a Consul agent that answers but cannot open a
/// session yet (its servers out of reach, or electing a leader) before it gives up.
const CONSUL_STARTUP_WAIT: Duration = Duration::from_secs(120);

/// Opens the lock session, waiting (with backoff, up to [`CONSUL_STARTUP_WAIT`]) while
/// Consul listens but cannot serve yet; at once when nothing listens at its address, or
/// when it refuses (a 4xx: an ACL, a bad request) or the settings cannot work.
async fn connect_consul(
    args: &ServeArgs,
    instance: &str,
    bound: std::net::SocketAddr,
) -> anyhow::Result<ConsulLocks> {
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(500);
    let mut attempt = 1u32;
    loop {
        let err = match ConsulLocks::connect(args.consul_config(instance, bound)).await {
            Ok(locks) => return Ok(locks),
            Err(err) => err,
        };
        let waited = started.elapsed();
        if !consul_may_recover(&err)
            || waited + pause > CONSUL_STARTUP_WAIT
            || unreachable(&args.consul).await.is_some()
        {
            return Err(consul_failed(&args.consul, err).await);
        }
        tracing::warn!(
            consul = %args.consul,
            attempt,
            error = %err,
            retry_in = ?pause,
            waited = ?waited,
            gives_up_after = ?CONSUL_STARTUP_WAIT,
            "Consul answers but cannot open a session yet (its servers out of reach, or \
             electing a leader); trying again",
        );
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shutdown_signal() => anyhow::bail!("stopped while waiting for Consul at {}", args.consul),
        }
        pause = (pause * 2).min(Duration::from_secs(5));
        attempt += 1;
    }
}

/// Whether a failure to open the session may pass by itself: a timeout or a server error,
/// not settings that cannot work or a refusal (HTTP 4xx).
fn consul_may_recover(err: &kafka_lease_server::coordination::CoordinationError) -> bool {
    use kafka_lease_server::coordination::CoordinationError as E;
    match err {
        E::Unavailable { operation, detail } => {
            !operation.starts_with("connect (") && !detail.contains("HTTP 4")
        }
        E::NoSession { .. } => true,
        _ => false,
    }
}

/// Why the gateway cannot start with Consul, in one line: where nothing answers at the
/// Consul address (the usual reason: Consul is not running), that, the one cause, and what to
/// do; otherwise what Consul answered.
async fn consul_failed(consul: &str, err: impl std::fmt::Display) -> anyhow::Error {
    match unreachable(consul).await {
        Some(cause) => anyhow::anyhow!(
            "cannot reach Consul at {consul}: {cause}. Start Consul there, or point --consul \
             at a running agent; or run `kafka-lease dev` to try kafka-lease with nothing \
             installed"
        ),
        None => anyhow::anyhow!("cannot open a Consul session at {consul}: {err}"),
    }
}

/// Why nothing answers at `url`'s host and port (a `http://` or `https://` URL): the error of
/// one TCP connection attempt; `None` when something accepts it.
async fn unreachable(url: &str) -> Option<std::io::Error> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
    let address = match (has_port, scheme) {
        (true, _) => authority.to_string(),
        (false, "https") => format!("{authority}:443"),
        (false, _) => format!("{authority}:80"),
    };
    match tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(&address),
    )
    .await
    {
        Ok(Ok(_)) => None,
        Ok(Err(err)) => Some(err),
        Err(_) => Some(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer within 2 s",
        )),
    }
}

async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let kafka_cluster = DevKafka::start(args.sample_records).await?;
    let store = MemoryLockStore::new();
    let (gateway, _locks) = kafka_lease_server::dev::gateway(
        &kafka_cluster,
        &store,
        "dev",
        None,
        Limits::default(),
        DEFAULT_MAX_GROUPS,
    )?;
    let clients = gateway.kafka().clone();
    print_dev_banner(&addr.to_string(), args.sample_records);
    println!("kafka-lease listening on {addr}");
    let options = ServeOptions {
        grace: Duration::from_secs(5),
        ..ServeOptions::default()
    };
    kafka_lease_server::server::serve(listener, gateway, shutdown_signal(), options).await?;
    // The clients go before the in-process cluster they talk to, quietly.
    clients.close().await;
    drop(clients);
    drop(kafka_cluster);
    Ok(())
}

fn print_dev_banner(addr: &str, per_partition: u32) {
    println!(
        r#"kafka-lease {VERSION} dev mode: in-process Kafka, in-memory locks. Not for production.
Listening on {addr}. Topic "{DEMO_TOPIC}" has {DEMO_PARTITIONS} partitions of {per_partition} sample records, one
second apart up to a second ago; of every ten, #3 has a null key, #5 is a tombstone (no value),
#7 has an empty value, #9 has a repeated header and one without a value.

Try it with grpcurl (reflection is on, no .proto needed; -emit-defaults shows zero values such
as offset 0 and partition 0, which grpcurl leaves out otherwise; keys and values print as
base64; max_records bounds each response, the Read goes on):

  grpcurl -plaintext {addr} list
  grpcurl -plaintext {addr} describe kafka_lease.v1.PartitionLeaseService
  grpcurl -plaintext -emit-defaults -d '{{"group":"demo-group","topic":"demo","member":"me"}}' {addr} kafka_lease.v1.PartitionLeaseService/Acquire
  grpcurl -plaintext -emit-defaults -d '{{"lease_id":"<lease_id>","max_records":5}}' {addr} kafka_lease.v1.PartitionLeaseService/Read
  grpcurl -plaintext -emit-defaults -d '{{"lease_id":"<lease_id>","offset":5}}' {addr} kafka_lease.v1.PartitionLeaseService/Commit
  grpcurl -plaintext -emit-defaults -d '{{"lease_id":"<lease_id>","earliest":{{}}}}' {addr} kafka_lease.v1.PartitionLeaseService/Seek
  grpcurl -plaintext -emit-defaults -d '{{"lease_id":"<lease_id>","timestamp":"<RFC 3339 time>"}}' {addr} kafka_lease.v1.PartitionLeaseService/Seek
  grpcurl -plaintext -emit-defaults -d '{{}}' {addr} kafka_lease.v1.PartitionLeaseService/ListLeases
  grpcurl -plaintext -d '{{"lease_id":"<lease_id>"}}' {addr} kafka_lease.v1.PartitionLeaseService/Release
  grpcurl -plaintext {addr} grpc.health.v1.Health/Check

Or print a partition's records and stop at its end (kcat -e style):

  kafka-lease tail --gateway {addr} --group demo-group --topic demo --exit-at-end

Press Ctrl-C to stop."#
    );
}
