//! The calls on a held lease: where a lease id is served ([`Gateway::resolve`], once per
//! call), then Read, Seek, Commit and Release on a lease this instance serves.

use std::sync::Arc;

use crate::error::{EndReason, LeaseError};
use crate::lease::{
    lease_ref, serving_instance, Ack, AckOutcome, Call, DeliverSettings, DeliverStream, Lease,
    ReadFrom, ReadLimits, ReadStream, SeekEpoch, SharedWindow,
};

use super::{Gateway, SeekTarget};

/// Where a lease id is served, as this instance knows it: the one answer every call on a
/// lease starts from (serve it here, forward it, or say why neither).
#[derive(Debug)]
pub enum Resolved {
    /// This instance serves it.
    Here(Arc<Lease>),
    /// The id names another instance, which serves it (or knows how it ended): a call on it
    /// is forwarded there.
    Elsewhere { lease_ref: String, instance: String },
    /// This instance served it, and it ended.
    Ended {
        lease_ref: String,
        reason: EndReason,
    },
    /// Neither this instance nor the id knows of it.
    Unknown { lease_ref: String },
}

impl Resolved {
    /// The lease, or why a call cannot be served here: LEASE_ENDED for one this instance
    /// served, WRONG_GATEWAY naming the instance the id says serves it (a call that was
    /// forwarded here already), NOT_FOUND otherwise.
    pub fn here(self) -> Result<Arc<Lease>, LeaseError> {
        match self {
            Resolved::Here(lease) => Ok(lease),
            Resolved::Elsewhere {
                lease_ref,
                instance,
            } => Err(LeaseError::WrongGateway {
                lease_ref,
                gateway: instance,
            }),
            Resolved::Ended { lease_ref, reason } => {
                Err(LeaseError::LeaseEnded { lease_ref, reason })
            }
            Resolved::Unknown { lease_ref } => Err(LeaseError::LeaseNotFound { lease_ref }),
        }
    }

    /// [`Resolved::here`] for a Release, which the contract answers NOT_FOUND (saying how it
    /// ended) on an ended lease.
    pub fn here_to_release(self) -> Result<Arc<Lease>, LeaseError> {
        match self {
            Resolved::Ended { lease_ref, reason } => {
                Err(LeaseError::ReleaseOfEnded { lease_ref, reason })
            }
            other => other.here(),
        }
    }
}

impl Gateway {
    /// Where `lease_id` is served. A lease this instance does not know is answered from the
    /// id alone, which names the instance that serves it: unknown ids cost no look at Consul
    /// (a client sending made-up ids cannot make the gateway scan every lock), and the answer
    /// does not depend on Consul being reachable.
    pub fn resolve(&self, lease_id: &str) -> Resolved {
        {
            let table = self.table();
            if let Some(lease) = table.lease(lease_id) {
                return Resolved::Here(lease.clone());
            }
            if let Some(reason) = table.ended(lease_id) {
                return Resolved::Ended {
                    lease_ref: lease_ref(lease_id).to_string(),
                    reason: reason.clone(),
                };
            }
        }
        let lease_ref = lease_ref(lease_id).to_string();
        match serving_instance(lease_id) {
            Some(instance) if instance != self.instance() => Resolved::Elsewhere {
                lease_ref,
                instance: instance.to_string(),
            },
            _ => Resolved::Unknown { lease_ref },
        }
    }

    /// The lease `lease_id` names, served here, or why not ([`Resolved::here`]).
    pub fn lease(&self, lease_id: &str) -> Result<Arc<Lease>, LeaseError> {
        self.resolve(lease_id).here()
    }

    /// Opens a Read on a lease, superseding any open one: at `from_offset` (checked against
    /// the partition's range, as a Seek to it is) or at the lease's resume point. With
    /// `if_seek_epoch`, `from_offset` counts only while the lease is still at that epoch.
    pub async fn read(
        &self,
        lease: &Arc<Lease>,
        limits: ReadLimits,
        from_offset: Option<i64>,
        if_seek_epoch: Option<SeekEpoch>,
    ) -> Result<ReadStream, LeaseError> {
        lease.begin(Call::Read)?;
        let from = from_offset.map(|offset| ReadFrom {
            offset,
            if_seek_epoch,
        });
        if let Some(from) = from.filter(|from| lease.still_at(from.if_seek_epoch)) {
            self.check_in_range(lease, from.offset).await?;
        }
        lease.open_read(limits, from)
    }

    /// Opens a Subscribe member's Read of a lease it holds, at its resume point, superseding
    /// any open one: [`Gateway::read`]'s door, with the guards of a member's Read
    /// ([`Call::SubscribeRead`]).
    pub fn read_at_resume_point(
        &self,
        lease: &Arc<Lease>,
        limits: ReadLimits,
    ) -> Result<ReadStream, LeaseError> {
        lease.begin(Call::SubscribeRead)?;
        lease.open_read(limits, None)
    }

    /// Fails with OUT_OF_RANGE unless `offset` lies between the partition's log start offset
    /// and its high watermark, inclusive.
    async fn check_in_range(&self, lease: &Lease, offset: i64) -> Result<(), LeaseError> {
        let (topic, partition) = (lease.key.topic.as_str(), lease.key.partition);
        let (low, high) = self.kafka.watermarks(topic, partition).await?;
        lease.note_high_watermark(high);
        if (low..=high).contains(&offset) {
            Ok(())
        } else {
            Err(LeaseError::OffsetOutOfRange {
                topic: topic.to_string(),
                partition,
                offset,
                low,
                high,
            })
        }
    }

    /// Repositions a lease; returns the resolved offset and the new seek epoch.
    pub async fn seek(
        &self,
        lease: &Arc<Lease>,
        target: SeekTarget,
    ) -> Result<(i64, SeekEpoch), LeaseError> {
        lease.begin(Call::Seek)?;
        let (topic, partition) = (lease.key.topic.as_str(), lease.key.partition);
        let (low, high) = self.kafka.watermarks(topic, partition).await?;
        lease.note_high_watermark(high);
        let offset = match target {
            SeekTarget::Offset(offset) => {
                if !(low..=high).contains(&offset) {
                    return Err(LeaseError::OffsetOutOfRange {
                        topic: topic.to_string(),
                        partition,
                        offset,
                        low,
                        high,
                    });
                }
                offset
            }
            SeekTarget::Earliest => low,
            SeekTarget::Latest => high,
            SeekTarget::TimestampMs(ms) => self
                .kafka
                .offset_for_time(topic, partition, ms)
                .await?
                .unwrap_or(high)
                .clamp(low, high),
            SeekTarget::Committed => match lease.committed_in_kafka().await? {
                Some(offset) if (low..=high).contains(&offset) => offset,
                _ => low,
            },
        };
        let epoch = lease.seek_to(offset)?;
        tracing::debug!(parent: &lease.span, offset, epoch = epoch.get(), "seek");
        Ok((offset, epoch))
    }

    /// Commits `offset` for the lease's partition, fenced by the lease's token. Returns the
    /// metadata stored with it.
    pub async fn commit(
        &self,
        lease: &Arc<Lease>,
        offset: i64,
        metadata: Option<&str>,
    ) -> Result<String, LeaseError> {
        lease.begin(Call::Commit)?;
        let (topic, partition) = (lease.key.topic.as_str(), lease.key.partition);
        let mut high = lease.cached_high_watermark();
        if offset > high {
            // The cached watermark may be behind the broker's; ask before refusing.
            let (_, fresh) = self.kafka.watermarks(topic, partition).await?;
            lease.note_high_watermark(fresh);
            high = fresh;
        }
        if offset < 0 || offset > high {
            return Err(LeaseError::OffsetOutOfRange {
                topic: topic.to_string(),
                partition,
                offset,
                low: 0,
                high,
            });
        }
        lease.commit(offset, metadata).await
    }

    /// Ends a lease at the client's request, committing first if asked. If the commit fails
    /// the lease is kept.
    pub async fn release(
        &self,
        lease: &Arc<Lease>,
        commit: Option<i64>,
    ) -> Result<Option<i64>, LeaseError> {
        if let Some(offset) = commit {
            lease.begin(Call::ReleaseWithCommit)?;
            self.commit(lease, offset, None).await?;
        }
        // In queue mode the gateway commits: what was done since its last commit, first.
        let called = tokio::time::Instant::now();
        lease.flush_queue().await?;
        self.end_lease(lease, EndReason::Released).await;
        tracing::debug!(
            parent: &lease.span,
            call_us = called.elapsed().as_micros() as u64,
            "the Release's call, from the gateway's side",
        );
        Ok(commit)
    }

    /// The dead letter topic a Deliver on `lease` names, or the default rule's
    /// (`dlq.<group>.<topic>`).
    pub fn dead_letter_topic(lease: &Lease, asked: Option<&str>) -> Result<String, LeaseError> {
        Self::dead_letter_topic_of(&lease.key.group, &lease.key.topic, asked)
    }

    /// The dead letter topic of `group`'s queue on `topic`: `asked`, or the default rule's.
    pub fn dead_letter_topic_of(
        group: &str,
        source: &str,
        asked: Option<&str>,
    ) -> Result<String, LeaseError> {
        let topic = match asked {
            Some(topic) => topic.to_string(),
            None => format!("dlq.{group}.{source}"),
        };
        if asked.is_none() && topic.len() > crate::validate::MAX_NAME_LEN {
            return Err(LeaseError::InvalidArgument {
                field: "dead_letter_topic",
                message: format!(
                    "the default dead letter topic name {topic:?} (dlq.<group>.<topic>) is {} \
                     characters, over Kafka's {}: name one in dead_letter_topic",
                    topic.len(),
                    crate::validate::MAX_NAME_LEN
                ),
            });
        }
        if topic == source {
            return Err(LeaseError::InvalidArgument {
                field: "dead_letter_topic",
                message: format!(
                    "dead_letter_topic {topic:?} is the lease's own topic: its dead letters \
                     would be delivered again; name another topic"
                ),
            });
        }
        Ok(topic)
    }

    /// Opens a Deliver on a lease (see [`Lease::open_deliver`]): the first one checks that
    /// the dead letter topic exists, and starts the queue from the progress the
    /// partition's last commit carried.
    pub async fn deliver(
        &self,
        lease: &Arc<Lease>,
        settings: DeliverSettings,
        shared: Option<Arc<SharedWindow>>,
    ) -> Result<DeliverStream, LeaseError> {
        let progress = match lease.begin(Call::Deliver)? {
            Some(_) => crate::queue::Progress::new(0),
            None => {
                self.check_dead_letter_topic(&settings.dead_letter_topic)
                    .await?;
                lease.committed_progress().await?
            }
        };
        lease.open_deliver(settings, progress, self.kafka.dead_letters(), shared)
    }

    /// Fails with NOT_FOUND, naming it, unless dead letter topic `topic` exists.
    pub async fn check_dead_letter_topic(&self, topic: &str) -> Result<(), LeaseError> {
        match self.kafka.partition_count(topic, None).await {
            Ok(_) => Ok(()),
            Err(LeaseError::TopicNotFound { topic }) => {
                Err(LeaseError::DeadLetterTopicNotFound { topic })
            }
            Err(err) => Err(err),
        }
    }

    /// Applies answers to a lease's deliveries.
    pub fn acknowledge(
        &self,
        lease: &Arc<Lease>,
        acks: &[Ack],
    ) -> Result<Vec<AckOutcome>, LeaseError> {
        lease.acknowledge(acks)
    }
}
