//! [`TopicAdmin`]: topics created, listed, described and deleted through Kafka's admin API
//! (librdkafka's), for `kafka-lease topics`. The gateway itself never creates or deletes a
//! topic; this is a tool for the people who run it, with the gateway's client settings (the
//! same `--kafka-config` properties reach the same brokers the same way).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, ConfigSource, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::metadata::Metadata;

use super::settings::{ClientLog, KafkaSettings};

/// What went wrong with a topic operation, in the words a person at a terminal needs.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("topic {topic:?} already exists")]
    Exists { topic: String },
    #[error("topic {topic:?} does not exist")]
    NotFound { topic: String },
    #[error("topic name {topic:?} is not allowed: {detail}")]
    InvalidName { topic: String, detail: String },
    #[error("replication factor {requested} is more than the cluster's {brokers} broker{}; allowed: 1 ..= {brokers}, or leave --replication-factor out for the brokers' default", if *brokers == 1 { "" } else { "s" })]
    ReplicationTooHigh { requested: i32, brokers: usize },
    #[error("the brokers refused {what}: {detail}")]
    Refused { what: String, detail: String },
    #[error("not authorized to {what}: {detail}")]
    Denied { what: String, detail: String },
    #[error("cannot reach Kafka at {servers} ({what}): {detail}")]
    Unreachable {
        servers: String,
        what: String,
        detail: String,
    },
}

/// A partition as the cluster's metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    pub id: i32,
    /// The leader's broker id; `None` while there is none.
    pub leader: Option<i32>,
    pub replicas: Vec<i32>,
    pub in_sync: Vec<i32>,
    /// `(log start offset, high watermark)`, where asked for and answered.
    pub offsets: Option<(i64, i64)>,
}

/// A topic as the cluster's metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub partitions: Vec<PartitionInfo>,
    /// Kafka's internal topics (`__consumer_offsets`, `__transaction_state`, ...).
    pub internal: bool,
}

impl TopicInfo {
    /// The replication factor: the replicas of its first partition.
    pub fn replication_factor(&self) -> usize {
        self.partitions.first().map_or(0, |p| p.replicas.len())
    }
}

/// A topic configuration entry that is not the brokers' built-in default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSetting {
    pub name: String,
    /// `None` for a sensitive value, which the brokers never show.
    pub value: Option<String>,
    /// Where it is set: `topic`, `broker`, `cluster` (a dynamic or static broker setting).
    pub source: &'static str,
}

/// What `create` asks for.
#[derive(Debug, Clone, Default)]
pub struct NewTopicSpec {
    pub name: String,
    /// `None`: the brokers' `num.partitions`.
    pub partitions: Option<i32>,
    /// `None`: the brokers' `default.replication.factor`.
    pub replication_factor: Option<i32>,
    pub configs: Vec<(String, String)>,
}

/// Kafka's admin API through one librdkafka client.
pub struct TopicAdmin {
    client: Arc<AdminClient<ClientLog>>,
    servers: String,
    timeout: Duration,
}

impl std::fmt::Debug for TopicAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicAdmin")
            .field("servers", &self.servers)
            .finish_non_exhaustive()
    }
}

impl TopicAdmin {
    /// An admin client with `settings` (bootstrap servers and the operator's properties);
    /// each request may take up to `timeout`.
    pub fn new(settings: &KafkaSettings, timeout: Duration) -> Result<Self, TopicError> {
        let mut config = settings.base_config();
        settings.apply_options(&mut config);
        let client = settings
            .create::<AdminClient<ClientLog>>(&config, "creating an admin client")
            .map_err(|e| TopicError::Refused {
                what: "the client settings".into(),
                detail: e.to_string(),
            })?;
        Ok(TopicAdmin {
            client: Arc::new(client),
            servers: settings.bootstrap_servers.clone(),
            timeout,
        })
    }

    fn options(&self) -> AdminOptions {
        AdminOptions::new()
            .request_timeout(Some(self.timeout))
            .operation_timeout(Some(self.timeout))
    }

    /// A whole-request failure (no per-topic answer), as a [`TopicError`].
    fn failed(&self, what: &str, err: &KafkaError) -> TopicError {
        use RDKafkaErrorCode as C;
        let detail = err.to_string();
        let what = what.to_string();
        match err.rdkafka_error_code() {
            Some(
                C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::SaslAuthenticationFailed
                | C::Authentication,
            ) => TopicError::Denied { what, detail },
            Some(
                C::InvalidTopic
                | C::InvalidPartitions
                | C::InvalidReplicationFactor
                | C::InvalidConfig
                | C::InvalidRequest
                | C::PolicyViolation
                | C::UnsupportedVersion
                | C::TopicDeletionDisabled,
            ) => TopicError::Refused { what, detail },
            _ => TopicError::Unreachable {
                servers: self.servers.clone(),
                what,
                detail,
            },
        }
    }

    /// The cluster's metadata: every topic, or `topic` alone.
    async fn metadata(&self, topic: Option<&str>) -> Result<Metadata, TopicError> {
        let timeout = self.timeout;
        let topic = topic.map(str::to_string);
        let client = self.client.clone();
        tokio::task::spawn_blocking(move || {
            client.inner().fetch_metadata(topic.as_deref(), timeout)
        })
        .await
        .map_err(|e| TopicError::Unreachable {
            servers: self.servers.clone(),
            what: "reading the cluster's metadata".into(),
            detail: e.to_string(),
        })?
        .map_err(|e| self.failed("reading the cluster's metadata", &e))
    }

    /// Creates a topic. Its partitions and replication factor as the brokers made them come
    /// back (read from the metadata once the new topic shows there).
    pub async fn create(&self, spec: &NewTopicSpec) -> Result<TopicInfo, TopicError> {
        let replication = spec.replication_factor.unwrap_or(-1);
        let mut topic = NewTopic::new(
            &spec.name,
            spec.partitions.unwrap_or(-1),
            TopicReplication::Fixed(replication),
        );
        for (key, value) in &spec.configs {
            topic = topic.set(key, value);
        }
        let what = format!("creating topic {:?}", spec.name);
        let answers = self
            .client
            .create_topics([&topic], &self.options())
            .await
            .map_err(|e| self.failed(&what, &e))?;
        for answer in answers {
            if let Err((name, code)) = answer {
                return Err(self.topic_refused(&what, &name, code, spec).await);
            }
        }
        // The controller answered; the metadata a broker serves follows within moments.
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            if let Some(info) = self.find(&spec.name).await? {
                if !info.partitions.is_empty() {
                    return Ok(info);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(TopicError::Unreachable {
                    servers: self.servers.clone(),
                    what: format!("waiting for the new topic {:?} to show", spec.name),
                    detail: "it was created, but the brokers' metadata did not list it in time"
                        .into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A per-topic refusal of a create, in words.
    async fn topic_refused(
        &self,
        what: &str,
        name: &str,
        code: RDKafkaErrorCode,
        spec: &NewTopicSpec,
    ) -> TopicError {
        use RDKafkaErrorCode as C;
        match code {
            C::TopicAlreadyExists => TopicError::Exists {
                topic: name.to_string(),
            },
            C::InvalidTopic => TopicError::InvalidName {
                topic: name.to_string(),
                detail: "the brokers refused it (allowed: 1 to 249 of [A-Za-z0-9._-], not \
                         \".\" or \"..\")"
                    .into(),
            },
            C::InvalidReplicationFactor => {
                let brokers = self.metadata(None).await.map(|m| m.brokers().len());
                match (spec.replication_factor, brokers) {
                    (Some(requested), Ok(brokers)) if requested as usize > brokers => {
                        TopicError::ReplicationTooHigh { requested, brokers }
                    }
                    _ => TopicError::Refused {
                        what: what.to_string(),
                        detail: format!(
                            "{code}: the replication factor ({}) is not one the cluster can \
                             place",
                            spec.replication_factor
                                .map_or("the brokers' default".to_string(), |r| r.to_string())
                        ),
                    },
                }
            }
            C::InvalidPartitions => TopicError::Refused {
                what: what.to_string(),
                detail: format!(
                    "{code}: {} partitions is not allowed; allowed: 1 or more",
                    spec.partitions.unwrap_or(-1)
                ),
            },
            C::InvalidConfig => TopicError::Refused {
                what: what.to_string(),
                detail: format!(
                    "{code}: a --config entry is not a topic configuration the brokers \
                     accept (given: {})",
                    spec.configs
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
            C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => TopicError::Denied {
                what: what.to_string(),
                detail: code.to_string(),
            },
            other => TopicError::Refused {
                what: what.to_string(),
                detail: other.to_string(),
            },
        }
    }

    /// Every topic, by name; Kafka's internal ones only with `internal`.
    pub async fn list(&self, internal: bool) -> Result<Vec<TopicInfo>, TopicError> {
        let metadata = self.metadata(None).await?;
        let mut topics: Vec<TopicInfo> = metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(topic_info)
            .filter(|t| internal || !t.internal)
            .collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(topics)
    }

    /// One topic, if it exists.
    async fn find(&self, topic: &str) -> Result<Option<TopicInfo>, TopicError> {
        let metadata = self.metadata(Some(topic)).await?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        match found.error().map(RDKafkaErrorCode::from) {
            None => Ok(Some(topic_info(found))),
            Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
                Ok(None)
            }
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => Err(TopicError::Denied {
                what: format!("describe topic {topic:?}"),
                detail: RDKafkaErrorCode::TopicAuthorizationFailed.to_string(),
            }),
            Some(code) => Err(TopicError::Refused {
                what: format!("describing topic {topic:?}"),
                detail: code.to_string(),
            }),
        }
    }

    /// One topic: its partitions with their offsets, and the configuration set on it (or on
    /// the brokers) that is not Kafka's built-in default.
    pub async fn describe(
        &self,
        topic: &str,
    ) -> Result<(TopicInfo, Vec<ConfigSetting>), TopicError> {
        let Some(mut info) = self.find(topic).await? else {
            return Err(TopicError::NotFound {
                topic: topic.to_string(),
            });
        };
        let client = self.client.clone();
        let name = topic.to_string();
        let timeout = self.timeout;
        let ids: Vec<i32> = info.partitions.iter().map(|p| p.id).collect();
        let offsets = tokio::task::spawn_blocking(move || {
            ids.into_iter()
                .map(|p| client.inner().fetch_watermarks(&name, p, timeout).ok())
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for (partition, offsets) in info.partitions.iter_mut().zip(offsets) {
            partition.offsets = offsets;
        }
        let what = format!("reading the configuration of topic {topic:?}");
        let answers = self
            .client
            .describe_configs([&ResourceSpecifier::Topic(topic)], &self.options())
            .await
            .map_err(|e| self.failed(&what, &e))?;
        let mut configs = Vec::new();
        for answer in answers {
            let resource = answer.map_err(|code| TopicError::Refused {
                what: what.clone(),
                detail: code.to_string(),
            })?;
            for entry in resource.entries {
                let source = match entry.source {
                    ConfigSource::DynamicTopic => "topic",
                    ConfigSource::DynamicBroker => "broker",
                    ConfigSource::DynamicDefaultBroker => "cluster",
                    ConfigSource::StaticBroker => "broker (static)",
                    ConfigSource::Default | ConfigSource::Unknown => continue,
                };
                configs.push(ConfigSetting {
                    name: entry.name,
                    value: if entry.is_sensitive {
                        None
                    } else {
                        entry.value
                    },
                    source,
                });
            }
        }
        configs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((info, configs))
    }

    /// Deletes a topic.
    pub async fn delete(&self, topic: &str) -> Result<(), TopicError> {
        let what = format!("deleting topic {topic:?}");
        let answers = self
            .client
            .delete_topics(&[topic], &self.options())
            .await
            .map_err(|e| self.failed(&what, &e))?;
        for answer in answers {
            if let Err((name, code)) = answer {
                return Err(match code {
                    RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => {
                        TopicError::NotFound { topic: name }
                    }
                    RDKafkaErrorCode::TopicAuthorizationFailed
                    | RDKafkaErrorCode::ClusterAuthorizationFailed => TopicError::Denied {
                        what,
                        detail: code.to_string(),
                    },
                    other => TopicError::Refused {
                        what,
                        detail: other.to_string(),
                    },
                });
            }
        }
        Ok(())
    }
}

fn topic_info(topic: &rdkafka::metadata::MetadataTopic) -> TopicInfo {
    let mut partitions: Vec<PartitionInfo> = topic
        .partitions()
        .iter()
        .map(|p| PartitionInfo {
            id: p.id(),
            leader: (p.leader() >= 0).then_some(p.leader()),
            replicas: p.replicas().to_vec(),
            in_sync: p.isr().to_vec(),
            offsets: None,
        })
        .collect();
    partitions.sort_by_key(|p| p.id);
    TopicInfo {
        name: topic.name().to_string(),
        internal: topic.name().starts_with("__"),
        partitions,
    }
}
