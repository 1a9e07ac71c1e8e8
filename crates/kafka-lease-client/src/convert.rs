//! Conversions between `std::time` and the protobuf well-known types, saturating instead of
//! panicking on values protobuf cannot hold; and [`Reset`], with its proto value.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kafka_lease_proto::v1 as proto;

/// `std` duration to protobuf duration; durations beyond `i64::MAX` seconds saturate (the
/// gateway then rejects them as out of range, with a message saying so).
pub(crate) fn duration_to_proto(duration: Duration) -> prost_types::Duration {
    match i64::try_from(duration.as_secs()) {
        Ok(seconds) => prost_types::Duration {
            seconds,
            // Always < 1e9, so it fits.
            nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(999_999_999),
        },
        Err(_) => prost_types::Duration {
            seconds: i64::MAX,
            nanos: 999_999_999,
        },
    }
}

/// Protobuf duration to `std` duration; `None` when absent or negative.
pub(crate) fn duration_from_proto(duration: Option<prost_types::Duration>) -> Option<Duration> {
    duration.and_then(|d| Duration::try_from(d).ok())
}

/// `SystemTime` to protobuf timestamp, before the epoch included; saturates at the ends of
/// protobuf's range instead of panicking like `prost_types`' `From` impl.
pub(crate) fn system_time_to_proto(time: SystemTime) -> prost_types::Timestamp {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => match i64::try_from(after.as_secs()) {
            Ok(seconds) => prost_types::Timestamp {
                seconds,
                nanos: i32::try_from(after.subsec_nanos()).unwrap_or(999_999_999),
            },
            Err(_) => prost_types::Timestamp {
                seconds: i64::MAX,
                nanos: 999_999_999,
            },
        },
        Err(before) => {
            let before = before.duration();
            let nanos = before.subsec_nanos();
            // Protobuf timestamps keep nanos in 0..1e9 and seconds floored.
            let (extra, nanos) = if nanos == 0 {
                (0, 0)
            } else {
                (1, 1_000_000_000 - nanos)
            };
            match i64::try_from(before.as_secs())
                .ok()
                .and_then(|s| s.checked_add(extra))
            {
                Some(seconds) => prost_types::Timestamp {
                    seconds: -seconds,
                    nanos: i32::try_from(nanos).unwrap_or(0),
                },
                None => prost_types::Timestamp {
                    seconds: i64::MIN,
                    nanos: 0,
                },
            }
        }
    }
}

/// Protobuf timestamp to `SystemTime`; `None` when absent or not representable.
pub(crate) fn system_time_from_proto(time: Option<prost_types::Timestamp>) -> Option<SystemTime> {
    time.and_then(|t| SystemTime::try_from(t).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_convert_both_ways() {
        let d = Duration::new(10, 250_000_000);
        let p = duration_to_proto(d);
        assert_eq!((p.seconds, p.nanos), (10, 250_000_000));
        assert_eq!(duration_from_proto(Some(p)), Some(d));
        assert_eq!(duration_from_proto(None), None);
        assert_eq!(
            duration_from_proto(Some(prost_types::Duration {
                seconds: -1,
                nanos: 0
            })),
            None
        );
    }

    #[test]
    fn huge_durations_saturate() {
        let p = duration_to_proto(Duration::MAX);
        assert_eq!((p.seconds, p.nanos), (i64::MAX, 999_999_999));
    }

    #[test]
    fn timestamps_after_the_epoch_round_trip() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        let p = system_time_to_proto(t);
        assert_eq!((p.seconds, p.nanos), (1_700_000_000, 123_456_789));
        assert_eq!(system_time_from_proto(Some(p)), Some(t));
    }

    #[test]
    fn timestamps_before_the_epoch_are_normalised() {
        // 1.25 s before the epoch is seconds = -2, nanos = 0.75 s.
        let t = UNIX_EPOCH - Duration::new(1, 250_000_000);
        let p = system_time_to_proto(t);
        assert_eq!((p.seconds, p.nanos), (-2, 750_000_000));
        assert_eq!(system_time_from_proto(Some(p)), Some(t));

        let t = UNIX_EPOCH - Duration::from_secs(3);
        let p = system_time_to_proto(t);
        assert_eq!((p.seconds, p.nanos), (-3, 0));
        assert_eq!(system_time_from_proto(Some(p)), Some(t));
    }

    #[test]
    fn absent_timestamp_is_none() {
        assert_eq!(system_time_from_proto(None), None);
    }
}

/// Where a lease starts when the group has no committed offset for the partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Reset {
    /// The oldest retained record (the log start offset).
    #[default]
    Earliest,
    /// The high watermark: only records produced after the Acquire are read.
    Latest,
}

impl From<Reset> for proto::OffsetReset {
    fn from(reset: Reset) -> Self {
        match reset {
            Reset::Earliest => proto::OffsetReset::Earliest,
            Reset::Latest => proto::OffsetReset::Latest,
        }
    }
}
