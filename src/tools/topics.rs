//! `kafka-lease topics`: create, list, describe and delete topics through Kafka's admin API.
//! Unlike `leases` and `tail` it talks to Kafka itself (as kcat and rpk do), with the
//! gateway's own Kafka flags (`--kafka`, `--kafka-config`, `--kafka-config-file`), so a
//! topic can be made on any cluster a gateway can reach without Kafka's own tooling.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use kafka_lease_server::config::{kafka_config_entry, kafka_properties, KafkaConfigEntry};
use kafka_lease_server::kafka::{
    ConfigSetting, KafkaSettings, NewTopicSpec, TopicAdmin, TopicError, TopicInfo,
};
use serde_json::json;

use super::leases::parse_topic;
use super::{render, Failure, EXIT_FAILURE, EXIT_NOPERM, EXIT_UNAVAILABLE};

/// Where Kafka is and how to talk to it: the gateway's own Kafka flags.
#[derive(Debug, Clone, Args)]
pub(crate) struct KafkaArgs {
    /// Kafka bootstrap servers, `host:port[,host:port...]` (as `serve --kafka`).
    #[arg(long, env = "KAFKA_LEASE_KAFKA", value_name = "SERVERS")]
    pub(crate) kafka: String,
    /// A librdkafka property, `key=value`: TLS, SASL (repeatable; as `serve --kafka-config`).
    #[arg(long = "kafka-config", env = "KAFKA_LEASE_KAFKA_OPTIONS", value_name = "KEY=VALUE",
          value_delimiter = ',', hide_env_values = true, value_parser = kafka_config_entry)]
    pub(crate) kafka_config: Vec<KafkaConfigEntry>,
    /// A properties file of librdkafka properties (as `serve --kafka-config-file`).
    #[arg(long, env = "KAFKA_LEASE_KAFKA_CONFIG_FILE", value_name = "PATH")]
    pub(crate) kafka_config_file: Option<PathBuf>,
    /// How long each request to Kafka may take.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_timeout)]
    pub(crate) timeout: Duration,
}

/// How `list` and `describe` print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TopicsOutput {
    /// A table for people.
    Table,
    /// JSON.
    Json,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct TopicsArgs {
    #[command(subcommand)]
    pub(crate) command: TopicsCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub(crate) enum TopicsCommand {
    /// Create a topic.
    Create {
        /// The topic's name: 1 to 249 of `[A-Za-z0-9._-]`, not `.` or `..`.
        #[arg(value_parser = parse_topic)]
        topic: String,
        /// Its partitions (default: the brokers' `num.partitions`).
        #[arg(long, short = 'p', value_name = "N", value_parser = parse_count)]
        partitions: Option<i32>,
        /// Its replication factor (default: the brokers' `default.replication.factor`).
        #[arg(long, short = 'r', value_name = "N", value_parser = parse_count)]
        replication_factor: Option<i32>,
        /// A topic configuration, `key=value` (repeatable), e.g. `retention.ms=86400000`.
        #[arg(long, short = 'c', value_name = "KEY=VALUE", value_parser = parse_topic_config)]
        config: Vec<(String, String)>,
        /// Succeed (exit 0) when the topic exists already, whatever its settings.
        #[arg(long)]
        if_not_exists: bool,
        #[command(flatten)]
        kafka: KafkaArgs,
    },
    /// List the topics: name, partitions, replication factor.
    List {
        /// Kafka's internal topics too (`__consumer_offsets`, ...).
        #[arg(long)]
        internal: bool,
        #[arg(long, value_enum, default_value = "table")]
        output: TopicsOutput,
        #[command(flatten)]
        kafka: KafkaArgs,
    },
    /// Describe a topic: each partition's leader, replicas, in-sync replicas and offsets, and
    /// the configuration that is not Kafka's built-in default.
    Describe {
        #[arg(value_parser = parse_topic)]
        topic: String,
        #[arg(long, value_enum, default_value = "table")]
        output: TopicsOutput,
        #[command(flatten)]
        kafka: KafkaArgs,
    },
    /// Delete a topic and all its records.
    Delete {
        #[arg(value_parser = parse_topic)]
        topic: String,
        /// Succeed (exit 0) when the topic does not exist.
        #[arg(long)]
        if_exists: bool,
        #[command(flatten)]
        kafka: KafkaArgs,
    },
}

/// `--partitions`, `--replication-factor`: 1 or more.
fn parse_count(value: &str) -> Result<i32, String> {
    match value.parse::<i32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{value:?} is not a count; allowed: 1 to {}",
            i32::MAX
        )),
    }
}

/// `--config`: `key=value` with a key of `[a-z0-9._-]`.
fn parse_topic_config(value: &str) -> Result<(String, String), String> {
    let allowed = "allowed: key=value, a topic configuration such as retention.ms=86400000";
    let Some((key, val)) = value.split_once('=') else {
        return Err(format!("{value:?} is not key=value; {allowed}"));
    };
    let key = key.trim();
    if key.is_empty()
        || !key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    {
        return Err(format!("{key:?} is not a configuration key; {allowed}"));
    }
    Ok((key.to_string(), val.trim().to_string()))
}

/// `--timeout`: a duration from 1 s to 10 min.
fn parse_timeout(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value) {
        Ok(d) if d >= Duration::from_secs(1) && d <= Duration::from_secs(600) => Ok(d),
        _ => Err(format!(
            "{value:?} is not a timeout; allowed: a duration from 1s to 10m, such as 30s"
        )),
    }
}

/// The exit status and line of a failed operation: 1 when Kafka refused it (exists, not
/// found, invalid), 69 when Kafka could not be reached, 77 when not authorized.
fn failure(err: TopicError) -> Failure {
    let status = match err {
        TopicError::Unreachable { .. } => EXIT_UNAVAILABLE,
        TopicError::Denied { .. } => EXIT_NOPERM,
        _ => EXIT_FAILURE,
    };
    Failure {
        status,
        line: err.to_string(),
    }
}

fn admin(args: &KafkaArgs) -> Result<TopicAdmin, Failure> {
    let properties = kafka_properties(args.kafka_config_file.as_deref(), &args.kafka_config)
        .map_err(|e| Failure::usage(e.to_string()))?;
    let mut settings = KafkaSettings::new(args.kafka.clone(), "topics");
    settings.options = properties;
    TopicAdmin::new(&settings, args.timeout).map_err(|e| Failure::usage(e.to_string()))
}

/// Runs the subcommand; the exit status.
pub(crate) async fn run(args: TopicsArgs) -> Result<u8, Failure> {
    let text = match args.command {
        TopicsCommand::Create {
            topic,
            partitions,
            replication_factor,
            config,
            if_not_exists,
            kafka,
        } => {
            let admin = admin(&kafka)?;
            let spec = NewTopicSpec {
                name: topic.clone(),
                partitions,
                replication_factor,
                configs: config,
            };
            match admin.create(&spec).await {
                Ok(info) => format!(
                    "created topic {:?}: {} partition{}, replication factor {}\n",
                    info.name,
                    info.partitions.len(),
                    plural(info.partitions.len()),
                    info.replication_factor()
                ),
                Err(TopicError::Exists { topic }) if if_not_exists => {
                    format!("topic {topic:?} exists already; nothing to do\n")
                }
                Err(e) => return Err(failure(e)),
            }
        }
        TopicsCommand::List {
            internal,
            output,
            kafka,
        } => {
            let topics = admin(&kafka)?.list(internal).await.map_err(failure)?;
            match output {
                TopicsOutput::Table => list_table(&topics),
                TopicsOutput::Json => list_json(&topics),
            }
        }
        TopicsCommand::Describe {
            topic,
            output,
            kafka,
        } => {
            let (info, configs) = admin(&kafka)?.describe(&topic).await.map_err(failure)?;
            match output {
                TopicsOutput::Table => describe_table(&info, &configs),
                TopicsOutput::Json => describe_json(&info, &configs),
            }
        }
        TopicsCommand::Delete {
            topic,
            if_exists,
            kafka,
        } => match admin(&kafka)?.delete(&topic).await {
            Ok(()) => format!("deleted topic {topic:?}\n"),
            Err(TopicError::NotFound { topic }) if if_exists => {
                format!("topic {topic:?} does not exist; nothing to do\n")
            }
            Err(e) => return Err(failure(e)),
        },
    };
    super::print(&text)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn list_table(topics: &[TopicInfo]) -> String {
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.partitions.len().to_string(),
                t.replication_factor().to_string(),
            ]
        })
        .collect();
    render::table(
        &[("TOPIC", false), ("PARTITIONS", true), ("REPLICAS", true)],
        &rows,
    )
}

fn list_json(topics: &[TopicInfo]) -> String {
    let list: Vec<serde_json::Value> = topics
        .iter()
        .map(|t| {
            json!({
                "topic": t.name,
                "partitions": t.partitions.len(),
                "replication_factor": t.replication_factor(),
                "internal": t.internal,
            })
        })
        .collect();
    pretty(&serde_json::Value::Array(list))
}

fn ids(list: &[i32]) -> String {
    list.iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn describe_table(info: &TopicInfo, configs: &[ConfigSetting]) -> String {
    let mut out = format!(
        "topic {:?}: {} partition{}, replication factor {}\n\n",
        info.name,
        info.partitions.len(),
        plural(info.partitions.len()),
        info.replication_factor()
    );
    let rows: Vec<Vec<String>> = info
        .partitions
        .iter()
        .map(|p| {
            let (low, high) = p.offsets.map_or(("-".into(), "-".into()), |(low, high)| {
                (low.to_string(), high.to_string())
            });
            vec![
                p.id.to_string(),
                p.leader.map_or("-".into(), |l| l.to_string()),
                ids(&p.replicas),
                ids(&p.in_sync),
                low,
                high,
            ]
        })
        .collect();
    out.push_str(&render::table(
        &[
            ("PARTITION", true),
            ("LEADER", true),
            ("REPLICAS", false),
            ("IN-SYNC", false),
            ("LOG START", true),
            ("HIGH WATERMARK", true),
        ],
        &rows,
    ));
    if configs.is_empty() {
        out.push_str("\nno configuration set beyond Kafka's defaults\n");
    } else {
        out.push('\n');
        let rows: Vec<Vec<String>> = configs
            .iter()
            .map(|c| {
                vec![
                    c.name.clone(),
                    c.value.clone().unwrap_or_else(|| "(sensitive)".into()),
                    c.source.to_string(),
                ]
            })
            .collect();
        out.push_str(&render::table(
            &[("CONFIG", false), ("VALUE", false), ("SET ON", false)],
            &rows,
        ));
    }
    out
}

fn describe_json(info: &TopicInfo, configs: &[ConfigSetting]) -> String {
    let partitions: Vec<serde_json::Value> = info
        .partitions
        .iter()
        .map(|p| {
            json!({
                "partition": p.id,
                "leader": p.leader,
                "replicas": p.replicas,
                "in_sync_replicas": p.in_sync,
                "log_start_offset": p.offsets.map(|(low, _)| low),
                "high_watermark": p.offsets.map(|(_, high)| high),
            })
        })
        .collect();
    let configs: serde_json::Map<String, serde_json::Value> = configs
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                json!({"value": c.value, "source": c.source}),
            )
        })
        .collect();
    pretty(&json!({
        "topic": info.name,
        "internal": info.internal,
        "replication_factor": info.replication_factor(),
        "partitions": partitions,
        "configs": configs,
    }))
}

fn pretty(value: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_configs_and_timeouts_are_checked_with_what_is_allowed() {
        assert_eq!(parse_count("4"), Ok(4));
        for bad in ["0", "-1", "x", ""] {
            let err = parse_count(bad).expect_err(bad);
            assert!(err.contains("allowed: 1 to"), "{err}");
        }
        assert_eq!(
            parse_topic_config("retention.ms = 1000"),
            Ok(("retention.ms".into(), "1000".into()))
        );
        assert_eq!(
            parse_topic_config("cleanup.policy=compact,delete"),
            Ok(("cleanup.policy".into(), "compact,delete".into()))
        );
        for bad in ["retention.ms", "=1", "Retention=1"] {
            let err = parse_topic_config(bad).expect_err(bad);
            assert!(err.contains("allowed: key=value"), "{err}");
        }
        assert_eq!(parse_timeout("5s"), Ok(Duration::from_secs(5)));
        assert!(parse_timeout("0s").is_err() && parse_timeout("1h").is_err());
    }
}
