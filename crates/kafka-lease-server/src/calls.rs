//! Long calls per client connection: how one connection carries thousands of Reads, waiting
//! Acquires and Subscribes and still gets a Commit through at once.
//!
//! HTTP/2 bounds the calls open at once on a connection (`SETTINGS_MAX_CONCURRENT_STREAMS`),
//! and a client queues calls past that bound, whatever they are: with long calls filling
//! the bound, a Commit on the same channel waits for one of them to end, which may be never.
//! So the gateway splits the bound in two. A *long* call (a Read, a Subscribe, an Acquire
//! that may wait) is admitted only while the connection has fewer than
//! `--max-long-calls-per-connection` of them open, and is refused past it with
//! RESOURCE_EXHAUSTED naming the flag; the stream bound is that plus
//! [`SHORT_CALL_STREAMS`], which only short calls (Commit, Seek, Release, ListLeases, an
//! Acquire that does not wait) can use, since every long call beyond its share is refused
//! as soon as it starts. A short call thus never queues behind long ones.
//!
//! A connection is its peer address, as for `--max-leases-per-connection`. Calls forwarded
//! by another instance count against the connection they came on; the forwarding pool
//! ([`crate::grpc::forward::Peers`]) opens another connection before one would be refused.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};

use crate::error::LeaseError;

/// Streams of a connection that long calls can never take: the room short calls always have.
pub const SHORT_CALL_STREAMS: u32 = 100;

/// Long calls open at once on one connection, by default: as many Reads as the connection
/// may hold leases, as many Acquires waiting as the instance allows, and this many
/// Subscribes besides.
pub const DEFAULT_SUBSCRIBES_PER_CONNECTION: u32 = 100;

/// The per-connection limits, derived from each other unless set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Long calls (Read, Subscribe, an Acquire that may wait) open at once on one connection.
    pub long_calls: u32,
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`: all calls open at once on one connection.
    pub streams: u32,
}

/// Stream and long-call bounds that leave short calls no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "--max-streams-per-connection {streams} must be larger than \
     --max-long-calls-per-connection {long_calls}: the difference is what short calls \
     (Commit, Seek, Release, ListLeases) always have on a connection; leave \
     --max-streams-per-connection unset for {long_calls} + {SHORT_CALL_STREAMS}"
)]
pub struct NoRoomForShortCalls {
    pub streams: u32,
    pub long_calls: u32,
}

impl ConnectionLimits {
    /// The limits for a gateway allowing `leases_per_connection` leases per connection and
    /// `waiting_acquires` waiting Acquires in all, with either bound overridden.
    ///
    /// The stream bound must leave room for short calls above the long-call bound;
    /// otherwise the error names both flags and the values.
    pub fn derive(
        leases_per_connection: u32,
        waiting_acquires: u32,
        long_calls: Option<u32>,
        streams: Option<u32>,
    ) -> Result<Self, NoRoomForShortCalls> {
        let long_calls = long_calls.unwrap_or_else(|| {
            leases_per_connection
                .saturating_add(waiting_acquires)
                .saturating_add(DEFAULT_SUBSCRIBES_PER_CONNECTION)
        });
        let streams = streams.unwrap_or_else(|| long_calls.saturating_add(SHORT_CALL_STREAMS));
        if streams <= long_calls {
            return Err(NoRoomForShortCalls {
                streams,
                long_calls,
            });
        }
        Ok(ConnectionLimits {
            long_calls,
            streams,
        })
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        let limits = crate::gateway::Limits::default();
        Self::derive(
            u32::try_from(limits.max_leases_per_connection).unwrap_or(u32::MAX),
            u32::try_from(limits.max_waiting_acquires).unwrap_or(u32::MAX),
            None,
            None,
        )
        .expect("the default limits agree")
    }
}

/// The long calls open on each client connection of one instance.
#[derive(Debug)]
pub struct LongCalls {
    limit: usize,
    open: Mutex<HashMap<SocketAddr, usize>>,
}

/// One admitted long call; given back when dropped (with the call's response stream, or
/// when the waiting Acquire ends).
#[derive(Debug)]
pub struct LongCall {
    calls: Arc<LongCalls>,
    via: SocketAddr,
}

impl Drop for LongCall {
    fn drop(&mut self) {
        let mut open = self.calls.lock();
        if let Some(count) = open.get_mut(&self.via) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.via);
            }
        }
    }
}

impl LongCalls {
    pub fn new(limit: u32) -> Arc<Self> {
        Arc::new(LongCalls {
            limit: limit as usize,
            open: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, usize>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits one long call `method` on the connection `via` (`None`: a caller without a
    /// peer address, which is not counted), or refuses it when the connection has as many
    /// as it may.
    pub fn admit(
        self: &Arc<Self>,
        via: Option<SocketAddr>,
        method: &str,
    ) -> Result<Option<LongCall>, LeaseError> {
        let Some(via) = via else { return Ok(None) };
        let mut open = self.lock();
        let count = open.get(&via).copied().unwrap_or(0);
        if count >= self.limit {
            return Err(LeaseError::LimitReached {
                flag: "--max-long-calls-per-connection",
                limit: self.limit,
                what: format!(
                    "the client connection from {via} has {count} long calls open (Reads, \
                     Subscribes, Acquires that wait) and may not open a {method} besides; end one, \
                     or open it on another connection"
                ),
            });
        }
        open.insert(via, count + 1);
        Ok(Some(LongCall {
            calls: self.clone(),
            via,
        }))
    }

    /// Long calls open on `via`.
    #[cfg(test)]
    fn open_on(&self, via: SocketAddr) -> usize {
        self.lock().get(&via).copied().unwrap_or(0)
    }

    /// Long calls open on all connections.
    #[cfg(test)]
    fn total(&self) -> usize {
        self.lock().values().sum()
    }
}

/// `stream`, holding `call` until it is dropped.
pub fn holding<T: 'static>(
    stream: Pin<Box<dyn Stream<Item = T> + Send>>,
    call: Option<LongCall>,
) -> Pin<Box<dyn Stream<Item = T> + Send>> {
    match call {
        None => stream,
        Some(call) => Box::pin(stream.map(move |item| {
            let _held = &call;
            item
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_leave_room_for_every_lease_and_waiter_and_for_short_calls() {
        let limits = ConnectionLimits::default();
        assert_eq!(limits.long_calls, 1_000 + 1_000 + 100);
        assert_eq!(limits.streams, limits.long_calls + SHORT_CALL_STREAMS);
    }

    #[test]
    fn a_stream_bound_without_room_for_short_calls_is_refused_naming_both_flags() {
        let err = ConnectionLimits::derive(1_000, 1_000, None, Some(200))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--max-streams-per-connection 200")
                && err.contains("--max-long-calls-per-connection 2100"),
            "{err}"
        );
        let ok = ConnectionLimits::derive(1_000, 1_000, Some(150), Some(200)).unwrap();
        assert_eq!((ok.long_calls, ok.streams), (150, 200));
        let derived = ConnectionLimits::derive(1, 0, Some(2), None).unwrap();
        assert_eq!(derived.streams, 2 + SHORT_CALL_STREAMS);
    }

    #[test]
    fn long_calls_are_counted_per_connection_and_given_back_on_drop() {
        let calls = LongCalls::new(2);
        let a: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:1001".parse().unwrap();
        let first = calls.admit(Some(a), "Read").unwrap();
        let _second = calls.admit(Some(a), "Read").unwrap();
        let refused = calls.admit(Some(a), "Subscribe").unwrap_err();
        let text = refused.to_string();
        assert!(
            text.contains("--max-long-calls-per-connection")
                && text.contains("127.0.0.1:1000")
                && text.contains("Subscribe"),
            "{text}"
        );
        assert!(calls.admit(Some(b), "Read").unwrap().is_some());
        assert!(calls.admit(None, "Read").unwrap().is_none());
        drop(first);
        assert_eq!(calls.open_on(a), 1);
        let _again = calls.admit(Some(a), "Read").unwrap();
        assert_eq!(calls.total(), 2);
    }
}
