//! ListLeases' live details of leases other instances serve: each serving instance asked
//! once per page for the rows it serves (a bounded fan-out, each answer within a bound and the
//! caller's deadline); a row whose instance cannot say keeps why in `details_unavailable`.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use kafka_lease_proto::v1;

use crate::auth::Caller;
use crate::coordination::CoordinationError;
use crate::error::LeaseError;
use crate::gateway::{Gateway, ListedLease};

use super::convert::lease_info;
use super::forward::{Peers, DESCRIBE_FANOUT, DESCRIBE_TIMEOUT};

/// Why an instance could not describe its leases: said in each of its rows.
#[derive(Debug, thiserror::Error)]
enum Undescribed {
    #[error("gateway instance {instance:?} did not answer within {limit:?}")]
    Late { instance: String, limit: Duration },
    #[error("gateway instance {instance:?} is not registered in Consul")]
    Unregistered { instance: String },
    #[error("looking up gateway instance {instance:?}: {source}")]
    Lookup {
        instance: String,
        #[source]
        source: CoordinationError,
    },
    #[error("{0}")]
    Unreachable(#[source] LeaseError),
    #[error("gateway instance {instance:?} at {address} did not answer: {}: {}", status.code(), status.message())]
    Refused {
        instance: String,
        address: String,
        status: tonic::Status,
    },
}

/// Asks the instances serving a page's leases for their live details.
pub(super) struct Describer<'a> {
    pub(super) gateway: &'a Gateway,
    pub(super) peers: &'a Peers,
}

impl Describer<'_> {
    /// The page's rows, each with the live details of its lease: from this instance's table,
    /// or asked of the instance serving it (at most [`DESCRIBE_FANOUT`] at once, each within
    /// [`DESCRIBE_TIMEOUT`] and the caller's deadline).
    pub(super) async fn with_live_details(
        &self,
        page: &[ListedLease],
        deadline: Option<tokio::time::Instant>,
    ) -> Vec<v1::LeaseInfo> {
        let mut rows: Vec<v1::LeaseInfo> = page.iter().map(lease_info).collect();
        // Instance → its address and the rows to ask it about.
        let mut asks: HashMap<String, (String, Vec<usize>)> = HashMap::new();
        for (i, listed) in page.iter().enumerate() {
            if listed.local.is_some() {
                continue;
            }
            let gateway = &listed.holder.gateway;
            if gateway == self.gateway.instance() {
                rows[i].details_unavailable =
                    "this instance no longer serves it (it ended a moment ago)".into();
                continue;
            }
            asks.entry(gateway.clone())
                .or_insert_with(|| (listed.holder.address.clone(), Vec::new()))
                .1
                .push(i);
        }
        let limit = deadline.map_or(DESCRIBE_TIMEOUT, |d| {
            d.saturating_duration_since(tokio::time::Instant::now())
                .min(DESCRIBE_TIMEOUT)
        });
        let answers = futures::stream::iter(asks)
            .map(|(instance, (address, indices))| {
                let keys: Vec<v1::LeaseKey> = indices
                    .iter()
                    .map(|&i| v1::LeaseKey {
                        group: page[i].key.group.clone(),
                        topic: page[i].key.topic.clone(),
                        partition: page[i].key.partition,
                        fencing_token: page[i].token.get(),
                    })
                    .collect();
                async move {
                    let answer =
                        tokio::time::timeout(limit, self.describe(&instance, address, keys))
                            .await
                            .unwrap_or_else(|_| {
                                Err(Undescribed::Late {
                                    instance: instance.clone(),
                                    limit,
                                })
                            });
                    (indices, answer)
                }
            })
            .buffer_unordered(DESCRIBE_FANOUT)
            .collect::<Vec<_>>()
            .await;
        for (indices, answer) in answers {
            match answer {
                Ok(described) => {
                    let by_key: HashMap<(String, String, i32, u64), v1::LeaseInfo> = described
                        .into_iter()
                        .map(|l| {
                            (
                                (
                                    l.group.clone(),
                                    l.topic.clone(),
                                    l.partition,
                                    l.fencing_token,
                                ),
                                l,
                            )
                        })
                        .collect();
                    for i in indices {
                        let row = &mut rows[i];
                        let key = (
                            row.group.clone(),
                            row.topic.clone(),
                            row.partition,
                            row.fencing_token,
                        );
                        match by_key.get(&key) {
                            Some(live) => {
                                row.expires_at = live.expires_at;
                                row.position = live.position;
                                row.committed_offset = live.committed_offset;
                                row.high_watermark = live.high_watermark;
                                row.lag = live.lag;
                                row.read_lag = live.read_lag;
                            }
                            None => {
                                row.details_unavailable = format!(
                                "gateway instance {:?} no longer serves it (it ended a moment ago)",
                                row.gateway
                            )
                            }
                        }
                    }
                }
                Err(why) => {
                    let why = why.to_string();
                    for i in indices {
                        rows[i].details_unavailable = why.clone();
                    }
                }
            }
        }
        rows
    }

    /// Asks `instance` (at `address`, or where its Consul record says when the lock names
    /// none) for the live details of `keys`.
    async fn describe(
        &self,
        instance: &str,
        address: String,
        keys: Vec<v1::LeaseKey>,
    ) -> Result<Vec<v1::LeaseInfo>, Undescribed> {
        let instance_name = || instance.to_string();
        let address = if address.is_empty() {
            match self.gateway.locks().instance_address(instance).await {
                Ok(Some(address)) => address,
                Ok(None) => {
                    return Err(Undescribed::Unregistered {
                        instance: instance_name(),
                    })
                }
                Err(source) => {
                    return Err(Undescribed::Lookup {
                        instance: instance_name(),
                        source,
                    })
                }
            }
        } else {
            address
        };
        let (mut client, _route) = self
            .peers
            .describer(instance, &address)
            .map_err(Undescribed::Unreachable)?;
        let request = self.peers.outgoing(
            v1::DescribeLeasesRequest { leases: keys },
            None,
            &Caller::anonymous(),
        );
        match client.describe_leases(request).await {
            Ok(answer) => Ok(answer.into_inner().leases),
            Err(status) => Err(Undescribed::Refused {
                instance: instance_name(),
                address,
                status,
            }),
        }
    }
}
