//! Subscriptions: a member of a group that shares the partitions of one or more topics with
//! the group's other members, across every gateway instance (the rule is in
//! [`crate::balance`]).
//!
//! One task per subscription ([`Member`]) on the gateway its stream is on. It joins each
//! topic (a member record beside the topic's locks, bound to the gateway's session), watches
//! each topic's view (locks and members, one blocking query per topic), and after every view
//! computes the member's share: it takes the free partitions the rule gives it (ordinary
//! leases through [`crate::gateway::Gateway::acquire`], tagged with the member id) and gives
//! up those beyond its quota (*revoking*: no records of the lease follow, the client has the
//! grace period to commit, then the lease is released). The leases' Reads are merged fairly
//! into one stream.
//!
//! The response stream carries control events (joined, assigned, revoking, revoked) on an
//! unbounded channel that is read first, and records on a channel of one: a batch is pulled
//! from a lease's Read only when the client has taken the previous one, so a slow client
//! slows its partitions' fetching, as a Read does. A batch of a lease already announced as
//! revoking or ended is dropped on the way out, so none follows its announcement.
//!
//! Files: this one (the spec, the events, [`Subscriptions`] joining a member and starting its
//! task), `members` (one stream per member id here), `stream` (the client's stream and each
//! topic's watch), `member` (the member task: plans, takes, revokes, merges the Reads).

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::Stream;
use tokio::sync::mpsc;

use crate::coordination::{unix_ms, MemberRecord};
use crate::error::LeaseError;
use crate::gateway::{Gateway, Granted, Reset};
use crate::lease::{Delivered, LeaseId, ReadBatch, ReadLimits};
use crate::queue::QueueSettings;

mod member;
mod members;
mod stream;
mod target;

use member::Member;
use members::{Claimed, Members};
use stream::outgoing;

/// A validated Subscribe.
#[derive(Clone, Debug)]
pub struct SubscribeSpec {
    pub group: String,
    /// Distinct topic names.
    pub topics: Vec<String>,
    pub member: String,
    /// Empty: the gateway makes one up.
    pub member_id: String,
    pub limits: ReadLimits,
    pub reset: Reset,
    /// Most partitions per topic; 0: no cap.
    pub max_partitions: u32,
    pub revoke_grace: Duration,
    /// How long the member stays, with its leases, after its stream is gone, for a
    /// Subscribe with its member id to take it over. Zero: it leaves at once.
    pub session_grace: Duration,
    /// The caller's identity, when it has one: the member's leases answer only it, and
    /// only it may take the member over.
    pub owner: Option<String>,
    /// Queue mode for every lease of the member, when asked for.
    pub queue: Option<SubscribeQueue>,
}

/// A Subscribe's queue mode: the settings of each lease's queue (its window is the one the
/// member's leases share), and the dead letter topic of each topic.
#[derive(Clone, Debug)]
pub struct SubscribeQueue {
    pub settings: QueueSettings,
    /// The dead letter topic the request named, for every topic; `None`: each topic's
    /// default (`dlq.<group>.<topic>`).
    pub asked_dead_letter_topic: Option<String>,
    /// Topic → its dead letter topic, resolved before the member starts.
    pub dead_letter_topics: std::collections::HashMap<String, String>,
}

/// A new stream for a detached member: its task's way back to a client.
#[derive(Debug)]
pub struct Attach {
    control: mpsc::UnboundedSender<Result<SubscriptionEvent, LeaseError>>,
    records: mpsc::Sender<SubscriptionEvent>,
    /// The new Subscribe: its topics must be the member's; its read limits and graces
    /// replace the old ones.
    spec: SubscribeSpec,
}

/// The way in to a detached member's task.
pub type Reattach = mpsc::UnboundedSender<Attach>;

/// Why a subscription's lease ended.
#[derive(Debug)]
pub enum Ended {
    /// It moved to another member (after `revoking`).
    Revoked,
    /// It ended otherwise: released, lost, expired, or with the gateway.
    Other(LeaseError),
}

/// What a subscription's stream carries.
#[derive(Debug)]
pub enum SubscriptionEvent {
    Joined {
        member_id: String,
        gateway: String,
    },
    Assigned(Granted),
    Records {
        lease_id: LeaseId,
        topic: String,
        partition: i32,
        batch: ReadBatch,
    },
    Deliveries {
        lease_id: LeaseId,
        topic: String,
        partition: i32,
        delivered: Delivered,
    },
    Revoking {
        lease_id: LeaseId,
        topic: String,
        partition: i32,
        deadline: SystemTime,
    },
    Revoked {
        lease_id: LeaseId,
        topic: String,
        partition: i32,
        why: Ended,
    },
}

impl SubscriptionEvent {
    /// The lease a revoking or revoked event announces the end of.
    fn ends(&self) -> Option<&LeaseId> {
        match self {
            SubscriptionEvent::Revoking { lease_id, .. }
            | SubscriptionEvent::Revoked { lease_id, .. } => Some(lease_id),
            _ => None,
        }
    }
}

/// A subscription's events, as the gRPC service hands them on.
pub type SubscriptionStream =
    Pin<Box<dyn Stream<Item = Result<SubscriptionEvent, LeaseError>> + Send>>;

/// A new member id: `m-` and 16 random hex digits.
pub fn new_member_id() -> String {
    format!("m-{:016x}", rand::random::<u64>())
}

/// The Subscribe service of one gateway instance: its members, each a task of its own.
#[derive(Debug, Clone)]
pub struct Subscriptions {
    gateway: Arc<Gateway>,
    members: Arc<Members>,
}

impl Subscriptions {
    /// The subscriptions served through `gateway`'s leases.
    pub fn new(gateway: Arc<Gateway>) -> Self {
        Self {
            gateway,
            members: Arc::default(),
        }
    }

    /// Joins the member to each topic and starts its task; the stream of its events. Fails
    /// before anything is joined for a topic that does not exist, and after leaving what it
    /// joined when the member id is active elsewhere.
    pub async fn subscribe(
        &self,
        mut spec: SubscribeSpec,
    ) -> Result<SubscriptionStream, LeaseError> {
        if self.gateway.is_shutting_down() {
            return Err(LeaseError::ShuttingDown);
        }
        for topic in &spec.topics {
            self.gateway.kafka().partition_count(topic, None).await?;
        }
        if let Some(queue) = &spec.queue {
            for topic in queue.dead_letter_topics.values() {
                self.gateway.check_dead_letter_topic(topic).await?;
            }
        }
        if spec.member_id.is_empty() {
            spec.member_id = new_member_id();
        }
        // One live subscription per member id here; other instances refuse it through the
        // member record, which this instance's session holds. A member detached within its
        // session grace is taken over: same leases, records again from their resume points.
        let active = || LeaseError::MemberActive {
            group: spec.group.clone(),
            topic: spec.topics.first().cloned().unwrap_or_default(),
            member_id: spec.member_id.clone(),
        };
        let claim = match self.members.claim(&spec.group, &spec.member_id) {
            Claimed::Attached => return Err(active()),
            Claimed::Detached(way_in) => {
                let (control, control_rx) = mpsc::unbounded_channel();
                let (records, records_rx) = mpsc::channel(1);
                let attach = Attach {
                    control,
                    records,
                    spec: spec.clone(),
                };
                if way_in.send(attach).is_err() {
                    // Its grace ended just now; its task is leaving.
                    return Err(active());
                }
                tracing::info!(
                    group = %spec.group,
                    member_id = %spec.member_id,
                    "member reattached",
                );
                return Ok(outgoing(control_rx, records_rx));
            }
            Claimed::New(claim) => claim,
        };
        let record = MemberRecord {
            member_id: spec.member_id.clone(),
            member: spec.member.clone(),
            gateway: self.gateway.instance().to_string(),
            max_partitions: spec.max_partitions,
            joined_at_ms: unix_ms(SystemTime::now()),
        };
        let mut joined = Vec::new();
        for topic in &spec.topics {
            match self.gateway.locks().join(&spec.group, topic, &record).await {
                Ok(true) => joined.push(topic.clone()),
                outcome => {
                    for topic in &joined {
                        let _ = self
                            .gateway
                            .locks()
                            .leave(&spec.group, topic, &spec.member_id)
                            .await;
                    }
                    return Err(match outcome {
                        Err(err) => err.into(),
                        _ => LeaseError::MemberActive {
                            group: spec.group.clone(),
                            topic: topic.clone(),
                            member_id: spec.member_id.clone(),
                        },
                    });
                }
            }
        }
        tracing::info!(
            group = %spec.group,
            topics = ?spec.topics,
            member_id = %spec.member_id,
            member = %spec.member,
            "member joined",
        );
        let (control, control_rx) = mpsc::unbounded_channel();
        let (records, records_rx) = mpsc::channel(1);
        let _ = control.send(Ok(SubscriptionEvent::Joined {
            member_id: spec.member_id.clone(),
            gateway: self.gateway.instance().to_string(),
        }));
        Member::start(claim, self.gateway.clone(), record, spec, control, records);
        Ok(outgoing(control_rx, records_rx))
    }
}
