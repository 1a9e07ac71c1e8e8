//! `kafka-lease leases`: who holds what, across every gateway instance.

use std::time::SystemTime;

use clap::{Args, ValueEnum};
use kafka_lease_client::LeaseFilter;

use super::{render, ConnectArgs, Failure};

/// How `leases` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LeasesOutput {
    /// A table for people.
    Table,
    /// One JSON array of lease objects.
    Json,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct LeasesArgs {
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
    /// Only the leases of this consumer group.
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    pub(crate) group: Option<String>,
    /// Only the leases of this topic.
    #[arg(long, value_name = "TOPIC", value_parser = parse_topic)]
    pub(crate) topic: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub(crate) output: LeasesOutput,
}

/// `--group`: the gateway's own rule for a group id.
pub(crate) fn parse_group(value: &str) -> Result<String, String> {
    kafka_lease_server::validate::group(value)
        .map(|()| value.to_string())
        .map_err(|e| e.to_string())
}

/// `--topic`: the gateway's own rule for a topic name.
pub(crate) fn parse_topic(value: &str) -> Result<String, String> {
    kafka_lease_server::validate::topic(value)
        .map(|()| value.to_string())
        .map_err(|e| e.to_string())
}

/// Lists the leases (every page) and prints them; the exit status.
pub(crate) async fn run(args: LeasesArgs) -> Result<u8, Failure> {
    let connection = super::connection(&args.connect)?;
    let client = connection.connect().await?;
    let mut filter = LeaseFilter::new();
    if let Some(group) = &args.group {
        filter = filter.group(group.clone());
    }
    if let Some(topic) = &args.topic {
        filter = filter.topic(topic.clone());
    }
    let leases = client
        .list_leases(filter)
        .await
        .map_err(|e| Failure::gateway(&e))?;
    let now = SystemTime::now();
    let text = match args.output {
        LeasesOutput::Table => render::leases_table(&leases, now),
        LeasesOutput::Json => render::leases_json(&leases, now),
    };
    super::print(&text)
}
