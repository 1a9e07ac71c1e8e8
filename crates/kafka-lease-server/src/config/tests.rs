//! The unit tests of the `serve` flags: parsing, validation, the derived settings, and the
//! operations manual checked against the flags.

use super::*;

#[derive(Debug, clap::Parser)]
struct TestCli {
    #[command(flatten)]
    serve: ServeArgs,
}

fn serve(args: &[&str]) -> Result<ServeArgs, String> {
    use clap::Parser;
    let mut full = vec!["kafka-lease"];
    full.extend_from_slice(args);
    TestCli::try_parse_from(full)
        .map(|c| c.serve)
        .map_err(|e| e.to_string())
}

/// Every flag of `serve` has a `KAFKA_LEASE_*` environment variable and a row in the
/// configuration table of docs/OPERATIONS.md that names it and, where clap has one, its
/// default: the flags are the one place each default is stated, and the manual is checked
/// against them.
#[test]
fn the_operations_manual_lists_every_flag_with_its_env_and_default() {
    use clap::CommandFactory;
    let manual = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/OPERATIONS.md"),
    )
    .expect("docs/OPERATIONS.md");
    let rows: Vec<&str> = manual.lines().filter(|l| l.starts_with("| `--")).collect();
    let command = TestCli::command();
    let mut checked = 0;
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" {
            continue;
        }
        let flag = format!("`--{long}`");
        let row = rows
            .iter()
            .find(|row| row.split(" | ").next().is_some_and(|f| f.contains(&flag)))
            .unwrap_or_else(|| panic!("docs/OPERATIONS.md has no row for --{long}"));
        // Every flag of `serve` can be set from the environment (containers set it so).
        let env = arg
            .get_env()
            .unwrap_or_else(|| panic!("--{long} has no environment variable"))
            .to_string_lossy();
        assert!(
            env.starts_with("KAFKA_LEASE_"),
            "--{long}'s environment variable {env} is not a KAFKA_LEASE_ one"
        );
        assert!(
            row.contains(&format!("`{env}`")),
            "the row of --{long} does not name {env}: {row}"
        );
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        if let [default] = defaults.as_slice() {
            let column = row.split(" | ").nth(2).unwrap_or_default();
            assert!(
                column.contains(&format!("`{default}`")),
                "the row of --{long} does not give its default {default:?}: {row}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 40, "only {checked} flags checked");
}

#[test]
fn defaults_are_the_documented_ones() {
    let s = serve(&["--kafka", "127.0.0.1:9092"]).expect("parse");
    assert_eq!(s.listen.to_string(), "127.0.0.1:50051");
    assert_eq!(s.consul_prefix, "kafka-lease");
    assert_eq!(s.session_ttl, Duration::from_secs(10));
    assert_eq!(s.shutdown_grace, Duration::from_secs(10));
    assert!(s.validate().is_ok());
}

#[test]
fn the_session_check_is_a_ttl_check_the_gateway_passes_unless_told_otherwise() {
    let bound = "127.0.0.1:50051".parse().expect("addr");
    let s = serve(&["--kafka", "k:1"]).expect("parse");
    assert_eq!(s.consul_check, ConsulCheck::Ttl);
    let check = s.consul_config("i", bound).check.expect("a check");
    assert_eq!(check, SessionCheck::ttl(Duration::from_secs(1)));
    assert_eq!(check.pass_interval(), Some(Duration::from_millis(200)));

    let s = serve(&["--kafka", "k:1", "--consul-check-ttl", "2s"]).expect("parse");
    s.validate().expect("valid");
    let check = s.consul_config("i", bound).check.expect("a check");
    assert_eq!(check.pass_interval(), Some(Duration::from_millis(400)));
    let s = serve(&["--kafka", "k:1", "--consul-check-ttl", "100ms"]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--consul-check-ttl")
            && err.contains("100ms")
            && err.contains("500ms ..= 10s"),
        "{err}"
    );

    // The address is the TCP check's alone: given with the TTL check it is refused,
    // naming what to do, rather than silently ignored.
    let s = serve(&["--kafka", "k:1", "--consul-check-addr", "10.0.0.7:50051"]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--consul-check-addr") && err.contains("--consul-check tcp"),
        "{err}"
    );
    let s = serve(&[
        "--kafka",
        "k:1",
        "--consul-check",
        "tcp",
        "--consul-check-addr",
        "10.0.0.7:50051",
    ])
    .expect("parse");
    s.validate().expect("valid");
    let check = s.consul_config("i", bound).check.expect("a check");
    assert_eq!(check.tcp_addr(), Some("10.0.0.7:50051"));
    let s = serve(&["--kafka", "k:1", "--consul-check", "none"]).expect("parse");
    assert_eq!(s.consul_config("i", bound).check, None);
}

#[test]
fn bad_values_are_refused_with_the_value_and_range() {
    let s = serve(&["--kafka", "k:1", "--session-ttl", "5s"]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--session-ttl") && err.contains("5s") && err.contains("10s"),
        "{err}"
    );
    let s = serve(&["--kafka", "k:1", "--consul-prefix", "a/../b"]).expect("parse");
    assert!(s.validate().is_err());
    let s = serve(&["--kafka", "k:1", "--consul", "127.0.0.1:8500"]).expect("parse");
    assert!(s.validate().unwrap_err().to_string().contains("http://"));
    assert!(serve(&["--kafka", "k:1", "--listen", "nope"]).is_err());
    let s = serve(&["--kafka", "k:1", "--kafka-option", "novalue"]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--kafka-config entry 1") && !err.contains("novalue"),
        "{err}"
    );
    let s = serve(&["--kafka", "k:1", "--keepalive-timeout", "500ms"]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--keepalive-timeout") && err.contains("500ms") && err.contains("1s ..= 10m"),
        "{err}"
    );
}

#[test]
fn the_consul_token_comes_from_its_file_and_errors_never_show_it() {
    let dir =
        std::env::temp_dir().join(format!("kafka-lease-token-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("token");
    std::fs::write(&file, "  s3cr3t-token\n").expect("write");
    let path = file.display().to_string();
    let s = serve(&["--kafka", "k:1", "--consul-token-file", &path]).expect("parse");
    assert!(s.validate().is_ok());
    assert_eq!(
        s.consul_token().expect("read").as_deref(),
        Some("s3cr3t-token")
    );
    assert_eq!(
        s.consul_config("i", "127.0.0.1:1".parse().expect("addr"))
            .token
            .as_deref(),
        Some("s3cr3t-token")
    );
    std::fs::write(&file, "\n").expect("write");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--consul-token-file") && err.contains("empty"),
        "{err}"
    );
    let missing = dir.join("missing").display().to_string();
    let s = serve(&["--kafka", "k:1", "--consul-token-file", &missing]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(err.contains(&missing), "{err}");
    // Both at once is refused by the parser; a CA needs an https:// address.
    assert!(serve(&[
        "--kafka",
        "k:1",
        "--consul-token",
        "t",
        "--consul-token-file",
        &path
    ])
    .is_err());
    let s = serve(&["--kafka", "k:1", "--consul-ca-cert", "ca.pem"]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--consul") && err.contains("https://"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn plaintext_leaves_loopback_only_when_asked_and_tls_needs_a_peer_ca() {
    let s = serve(&["--kafka", "k:1", "--listen", "10.0.0.7:50051"]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--listen") && err.contains("10.0.0.7:50051") && err.contains("--plaintext"),
        "{err}"
    );
    let s = serve(&[
        "--kafka",
        "k:1",
        "--listen",
        "10.0.0.7:50051",
        "--plaintext",
    ])
    .expect("parse");
    assert!(s.validate().is_ok());
    let tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem"];
    let mut args = vec!["--kafka", "k:1", "--listen", "10.0.0.7:50051"];
    args.extend(tls);
    let err = serve(&args)
        .expect("parse")
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("--tls-peer-ca"), "{err}");
    args.extend(["--tls-client-ca", "ca.pem"]);
    assert!(serve(&args).expect("parse").validate().is_ok());
    // Plaintext and TLS at once, or half a key pair, are refused by the parser.
    assert!(serve(&[
        "--kafka",
        "k:1",
        "--tls-cert",
        "c",
        "--tls-key",
        "k",
        "--plaintext"
    ])
    .is_err());
    assert!(serve(&["--kafka", "k:1", "--tls-cert", "c"]).is_err());
    assert!(serve(&["--kafka", "k:1", "--tls-client-ca", "ca"]).is_err());
    let s = serve(&["--kafka", "k:1", "--reflection", "false"]).expect("parse");
    assert!(!s.security.reflection);
}

#[test]
fn the_advertised_address_is_the_listen_address_unless_that_is_a_wildcard() {
    let bound: SocketAddr = "10.0.0.7:41234".parse().expect("addr");
    let s = serve(&["--kafka", "k:1", "--listen", "10.0.0.7:0"]).expect("parse");
    assert_eq!(s.advertise(bound).expect("concrete"), "10.0.0.7:41234");
    assert_eq!(
        s.consul_config("i", bound).advertise.as_deref(),
        Some("10.0.0.7:41234")
    );

    let s = serve(&["--kafka", "k:1", "--listen", "0.0.0.0:50051", "--plaintext"]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--advertise-addr") && err.contains("0.0.0.0:50051"),
        "{err}"
    );
    let s = serve(&["--kafka", "k:1", "--listen", "[::]:50051", "--plaintext"]).expect("parse");
    assert!(s.validate().is_err());

    let s = serve(&[
        "--kafka",
        "k:1",
        "--listen",
        "0.0.0.0:50051",
        "--advertise-addr",
        "gw-1.kafka-lease:50051",
        "--plaintext",
    ])
    .expect("parse");
    assert!(s.validate().is_ok());
    assert_eq!(s.advertise(bound).expect("given"), "gw-1.kafka-lease:50051");

    for bad in ["no-port", "host:0", "host:x", ":50051", "a/b:1"] {
        let s = serve(&["--kafka", "k:1", "--advertise-addr", bad]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--advertise-addr") && err.contains(bad),
            "{bad}: {err}"
        );
    }
}

/// A properties file of its own for one test, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "kafka-lease-config-test-{}-{:016x}.properties",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::write(&path, text).expect("write the properties file");
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn kafka_config_flags_override_the_file_and_the_old_name_still_works() {
    let file = TempFile::new(
        "# credentials\n\
         security.protocol = sasl_ssl\n\
         sasl.username=from-file\n\
         sasl.password = S3cr3t=with#chars\n",
    );
    let s = serve(&[
        "--kafka",
        "k:1",
        "--kafka-config-file",
        file.path(),
        "--kafka-config",
        "sasl.username=from-flag",
        "--kafka-option",
        "sasl.mechanism=SCRAM-SHA-256,client.rack=r1",
    ])
    .expect("parse");
    assert!(s.validate().is_ok());
    let properties = s.kafka_properties().expect("properties");
    let all: Vec<_> = properties.iter().collect();
    assert_eq!(
        all,
        vec![
            ("security.protocol", "sasl_ssl"),
            ("sasl.username", "from-flag"),
            ("sasl.password", "S3cr3t=with#chars"),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("client.rack", "r1"),
        ]
    );
    let debug = format!("{s:?} {properties:?}");
    assert!(!debug.contains("S3cr3t"), "{debug}");
}

#[test]
fn kafka_config_values_are_never_quoted_in_errors_or_debug() {
    let s = serve(&[
        "--kafka",
        "k:1",
        "--kafka-config",
        "client.rack=r1",
        // A password holding a comma: split in two, the second piece is not key=value.
        "--kafka-config",
        "sasl.password=S3cr3t,tail-S3cr3t",
    ])
    .expect("parse: values are checked later, never by clap");
    let err = s.validate().unwrap_err().to_string();
    assert!(err.contains("--kafka-config entry 3"), "{err}");
    assert!(err.contains("--kafka-config-file"), "{err}");
    assert!(!err.contains("S3cr3t"), "{err}");
    let debug = format!("{s:?}");
    assert!(debug.contains("sasl.password=<value not shown>"), "{debug}");
    assert!(!debug.contains("S3cr3t"), "{debug}");
}

#[test]
fn keys_the_gateway_sets_are_refused_from_flags_and_from_the_file() {
    for key in ["group.id", "enable.auto.commit", "bootstrap.servers"] {
        let s = serve(&["--kafka", "k:1", "--kafka-config", &format!("{key}=x")]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("--kafka-config") && err.contains(key), "{err}");

        let file = TempFile::new(&format!("a.b=1\n\n{key} = S3cr3t\n"));
        let s = serve(&["--kafka", "k:1", "--kafka-config-file", file.path()]).expect("parse");
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("--kafka-config-file")
                && err.contains(&format!("{} line 3 ({key})", file.path())),
            "{err}"
        );
        assert!(!err.contains("S3cr3t"), "{err}");
    }
}

#[test]
fn a_bad_properties_file_is_refused_naming_the_file_and_line_but_no_value() {
    let file = TempFile::new("# ok\nsasl.username=u\nS3cr3t-on-a-line-of-its-own\n");
    let s = serve(&["--kafka", "k:1", "--kafka-config-file", file.path()]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains(&format!("--kafka-config-file {} line 3", file.path())),
        "{err}"
    );
    assert!(
        err.contains("key=value") && err.contains('#') && err.contains('!'),
        "names what is allowed: {err}"
    );
    assert!(!err.contains("S3cr3t"), "{err}");

    let missing = std::env::temp_dir().join("kafka-lease-no-such-file.properties");
    let missing = missing.to_str().expect("utf-8");
    let s = serve(&["--kafka", "k:1", "--kafka-config-file", missing]).expect("parse");
    let err = s.validate().unwrap_err().to_string();
    assert!(
        err.contains("--kafka-config-file") && err.contains(missing) && err.contains("key=value"),
        "{err}"
    );
}

/// A flag left out gives what the library takes when nobody sets it: the flags' defaults
/// and the library's (`Limits`, `KafkaSettings`, `ServeOptions`, `ConsulLockConfig`) are
/// one set of values, whichever way the gateway is built.
#[test]
fn flags_left_out_give_the_library_defaults() {
    let args = serve(&["--kafka", "127.0.0.1:9092"]).expect("parses");
    assert_eq!(args.limits(), Limits::default());

    let kafka = args.kafka_settings("i", KafkaProperties::new());
    let library = KafkaSettings::new("127.0.0.1:9092", "i");
    assert_eq!(
        (kafka.queue_kbytes_per_partition, kafka.max_groups),
        (library.queue_kbytes_per_partition, library.max_groups)
    );

    let options = args.serve_options(None, Auth::open()).expect("options");
    let library = ServeOptions::default();
    assert_eq!(
        (
            options.grace,
            options.keepalive_interval,
            options.keepalive_timeout,
            options.connection_limits,
            options.reflection,
        ),
        (
            library.grace,
            library.keepalive_interval,
            library.keepalive_timeout,
            library.connection_limits,
            library.reflection,
        )
    );

    let consul = args.consul_config("i", "127.0.0.1:50051".parse().unwrap());
    let library = ConsulLockConfig::default();
    assert_eq!(
        (
            consul.address,
            consul.prefix,
            consul.session_ttl,
            consul.lock_delay,
            consul.renew_interval,
        ),
        (
            library.address,
            library.prefix,
            library.session_ttl,
            library.lock_delay,
            library.renew_interval,
        )
    );
    assert_eq!(
        consul.check,
        Some(SessionCheck::ttl(
            crate::coordination::consul::DEFAULT_CHECK_TTL
        ))
    );
}
