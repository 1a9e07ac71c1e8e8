//! The subscription's side of the wire: the stream the client gets (control events first,
//! nothing of a lease after its end is announced), and the watch of each subscribed topic.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::coordination::TopicView;
use crate::error::LeaseError;
use crate::gateway::Gateway;
use crate::lease::LeaseId;

use super::{SubscriptionEvent, SubscriptionStream};

/// How long a topic's watch waits per round.
const VIEW_WAIT: Duration = Duration::from_secs(60);

/// The stream the client gets: control events first; a batch of a lease announced as
/// revoking or ended is dropped.
///
/// A batch can be behind its lease's end only when it was already in the records channel
/// (of one) when the end was announced: the member task sends nothing of a lease once it is
/// revoking or gone. So the set of ended leases is emptied at every batch taken from the
/// channel, and stays bounded by the leases that end between two batches.
pub(super) fn outgoing(
    control: mpsc::UnboundedReceiver<Result<SubscriptionEvent, LeaseError>>,
    records: mpsc::Receiver<SubscriptionEvent>,
) -> SubscriptionStream {
    let state = (control, records, HashSet::<LeaseId>::new());
    Box::pin(futures::stream::unfold(
        state,
        |(mut control, mut records, mut ended)| async move {
            loop {
                let next = tokio::select! {
                    biased;
                    event = control.recv() => event?,
                    Some(event) = records.recv() => Ok(event),
                };
                match &next {
                    Ok(SubscriptionEvent::Records { lease_id, .. }) => {
                        let stale = ended.contains(lease_id);
                        ended.clear();
                        if stale {
                            continue;
                        }
                    }
                    Ok(event) => {
                        if let Some(lease_id) = event.ends() {
                            ended.insert(lease_id.clone());
                        }
                    }
                    Err(_) => {}
                }
                return Some((next, (control, records, ended)));
            }
        },
    ))
}

/// Sends each new view of (`group`, `topic`) to the member task, until it is gone.
pub(super) async fn watch_topic(
    gateway: Arc<Gateway>,
    group: String,
    topic: String,
    views: mpsc::Sender<(String, TopicView)>,
) {
    let mut index = None;
    loop {
        match gateway
            .locks()
            .topic_view(&group, &topic, index, VIEW_WAIT)
            .await
        {
            Ok(view) => {
                if index == Some(view.index) {
                    continue;
                }
                index = Some(view.index);
                if views.send((topic.clone(), view)).await.is_err() {
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(
                    %group,
                    %topic,
                    %error,
                    "watching a subscribed topic failed; retrying",
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
