//! The HTTP wire of this backend: the request types consulrs lacks or gets wrong (the
//! leader's status, the service registration Consul 1.8 accepts, the TTL check's pass,
//! `/v1/txn`), and the parsers of the answers read raw (a txn's outcome, a KV read with its
//! index, a holder's JSON). `http.rs` sends them; nothing here does I/O.

use std::collections::HashMap;
use std::fmt;

use consulrs::api::features::{FeaturedEndpoint, Features};
use consulrs::api::kv::common::KVPair;
use rustify::endpoint::Endpoint;
use rustify::enums::{RequestMethod, RequestType, ResponseType};
use serde::Serialize;

use crate::{CoordinationError, HolderInfo};

use super::{
    describe, go_duration, unavailable, CheckKind, ConsulLockConfig, RawAnswer, SessionCheck,
    META_CHECK_TCP, META_INSTANCE, SERVICE_NAME,
};

/// A KV read with its index, whatever the status: 404 is "no entries", not an error.
pub(super) struct KvRead<T> {
    pub(super) index: u64,
    pub(super) entries: Vec<T>,
}

/// `GET /v1/status/leader`, which consulrs has no call for.
pub(super) struct StatusLeader;

impl Endpoint for StatusLeader {
    type Response = String;
    const REQUEST_BODY_TYPE: RequestType = RequestType::JSON;
    const RESPONSE_BODY_TYPE: ResponseType = ResponseType::JSON;

    fn path(&self) -> String {
        "status/leader".into()
    }

    fn method(&self) -> RequestMethod {
        RequestMethod::GET
    }
}

impl FeaturedEndpoint for StatusLeader {
    fn features(&self) -> Option<Features> {
        None
    }
}

/// `PUT /v1/agent/service/register` with exactly the fields set here: consulrs' own request
/// type also sends `"Ns": null`, which Consul 1.8 refuses ("unknown field").
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct RegisterService {
    #[serde(rename = "ID")]
    pub(super) id: String,
    pub(super) name: &'static str,
    pub(super) meta: HashMap<&'static str, String>,
    pub(super) check: CheckDefinition,
}

/// The service's check: a TTL check (`TTL`) or a TCP check (`TCP`, `Interval`, `Timeout`).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct CheckDefinition {
    #[serde(rename = "CheckID")]
    pub(super) check_id: String,
    pub(super) name: String,
    #[serde(rename = "TTL", skip_serializing_if = "Option::is_none")]
    pub(super) ttl: Option<String>,
    #[serde(rename = "TCP", skip_serializing_if = "Option::is_none")]
    pub(super) tcp: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) timeout: Option<String>,
    pub(super) deregister_critical_service_after: String,
    /// `passing`, so that the session can be bound to the check at once instead of after its
    /// first run or pass (Consul refuses to bind a session to a critical check).
    pub(super) status: &'static str,
}

impl RegisterService {
    pub(super) fn new(config: &ConsulLockConfig, check: &SessionCheck) -> Self {
        let mut meta = HashMap::from([(META_INSTANCE, config.instance.clone())]);
        let mut definition = CheckDefinition {
            check_id: config.check_id(),
            name: format!("kafka-lease gateway {} is alive", config.instance),
            ttl: None,
            tcp: None,
            interval: None,
            timeout: None,
            deregister_critical_service_after: go_duration(check.deregister_after),
            status: "passing",
        };
        match &check.kind {
            CheckKind::Ttl { ttl } => definition.ttl = Some(go_duration(*ttl)),
            CheckKind::Tcp {
                addr,
                interval,
                timeout,
            } => {
                meta.insert(META_CHECK_TCP, addr.clone());
                definition.tcp = Some(addr.clone());
                definition.interval = Some(go_duration(*interval));
                definition.timeout = Some(go_duration(*timeout));
            }
        }
        Self {
            id: config.service_id(),
            name: SERVICE_NAME,
            meta,
            check: definition,
        }
    }
}

/// `PUT /v1/agent/check/pass/<id>`: resets a TTL check's timer, status passing.
pub(super) struct PassCheck {
    pub(super) check_id: String,
}

impl Endpoint for PassCheck {
    type Response = ();
    const REQUEST_BODY_TYPE: RequestType = RequestType::JSON;
    const RESPONSE_BODY_TYPE: ResponseType = ResponseType::JSON;

    fn path(&self) -> String {
        format!("agent/check/pass/{}", self.check_id)
    }

    fn method(&self) -> RequestMethod {
        RequestMethod::PUT
    }
}

impl FeaturedEndpoint for PassCheck {
    fn features(&self) -> Option<Features> {
        None
    }
}

impl Endpoint for RegisterService {
    type Response = ();
    const REQUEST_BODY_TYPE: RequestType = RequestType::JSON;
    const RESPONSE_BODY_TYPE: ResponseType = ResponseType::JSON;

    fn path(&self) -> String {
        "agent/service/register".into()
    }

    fn method(&self) -> RequestMethod {
        RequestMethod::PUT
    }

    fn body(&self) -> Result<Option<Vec<u8>>, rustify::errors::ClientError> {
        serde_json::to_vec(self)
            .map(Some)
            .map_err(|e| rustify::errors::ClientError::DataParseError { source: e.into() })
    }
}

impl FeaturedEndpoint for RegisterService {
    fn features(&self) -> Option<Features> {
        None
    }
}

/// `PUT /v1/txn`: KV operations applied as one Raft write, all or none. consulrs has no
/// call for it.
pub(super) struct Txn {
    pub(super) ops: Vec<TxnOp>,
}

#[derive(Serialize)]
pub(super) struct TxnOp {
    #[serde(rename = "KV")]
    kv: TxnKv,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct TxnKv {
    verb: &'static str,
    key: String,
    /// Base64, as Consul's txn API takes values.
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<String>,
    /// For `cas`: the `ModifyIndex` the key must have (0: the key must not exist).
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u64>,
}

impl TxnOp {
    /// Locks `key` for `session` with `value`; fails if another session holds it or the
    /// key is under lock-delay.
    pub(super) fn lock(key: &str, value: &[u8], session: &str) -> Self {
        use base64::Engine as _;
        TxnOp {
            kv: TxnKv {
                verb: "lock",
                key: key.to_string(),
                value: Some(base64::engine::general_purpose::STANDARD.encode(value)),
                session: Some(session.to_string()),
                index: None,
            },
        }
    }

    /// Sets `key` to `value` if its `ModifyIndex` is still `index` (0: if it does not exist);
    /// bound to no session.
    pub(super) fn cas(key: &str, value: &[u8], index: u64) -> Self {
        use base64::Engine as _;
        TxnOp {
            kv: TxnKv {
                verb: "cas",
                key: key.to_string(),
                value: Some(base64::engine::general_purpose::STANDARD.encode(value)),
                session: None,
                index: Some(index),
            },
        }
    }

    /// Deletes `key` if its `ModifyIndex` is still `index`.
    pub(super) fn delete_cas(key: &str, index: u64) -> Self {
        TxnOp {
            kv: TxnKv {
                verb: "delete-cas",
                key: key.to_string(),
                value: None,
                session: None,
                index: Some(index),
            },
        }
    }

    /// Fails the transaction unless `session` holds `key`.
    pub(super) fn check_session(key: &str, session: &str) -> Self {
        TxnOp {
            kv: TxnKv {
                verb: "check-session",
                key: key.to_string(),
                value: None,
                session: Some(session.to_string()),
                index: None,
            },
        }
    }

    /// Deletes `key`.
    pub(super) fn delete(key: &str) -> Self {
        TxnOp {
            kv: TxnKv {
                verb: "delete",
                key: key.to_string(),
                value: None,
                session: None,
                index: None,
            },
        }
    }
}

impl Endpoint for Txn {
    type Response = ();
    const REQUEST_BODY_TYPE: RequestType = RequestType::JSON;
    const RESPONSE_BODY_TYPE: ResponseType = ResponseType::JSON;

    fn path(&self) -> String {
        "txn".into()
    }

    fn method(&self) -> RequestMethod {
        RequestMethod::PUT
    }

    fn body(&self) -> Result<Option<Vec<u8>>, rustify::errors::ClientError> {
        serde_json::to_vec(&self.ops)
            .map(Some)
            .map_err(|e| rustify::errors::ClientError::DataParseError { source: e.into() })
    }
}

impl FeaturedEndpoint for Txn {
    fn features(&self) -> Option<Features> {
        None
    }
}

/// The body of a txn answer: `Results` when it was applied (200), `Errors` when it was
/// rolled back (409).
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TxnAnswer {
    results: Option<Vec<TxnResult>>,
    errors: Option<Vec<TxnError>>,
}

#[derive(serde::Deserialize)]
struct TxnResult {
    #[serde(rename = "KV")]
    kv: Option<KVPair>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TxnError {
    what: String,
}

/// What came of an applied-or-refused transaction.
#[derive(Debug)]
pub(super) enum TxnOutcome {
    /// Applied, with the KV entries its operations returned.
    Applied(Vec<KVPair>),
    /// Rolled back (HTTP 409), with Consul's reasons.
    Refused(TxnRefusal),
}

/// Why Consul rolled a transaction back, told apart once here from the reasons it gives
/// (one per failed operation, joined with "; "). Each variant keeps that text, for messages
/// (its `Display`). When the text names several cases, the first of this order wins:
/// invalid session, lock delay, already held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TxnRefusal {
    /// The session is unknown to Consul (`invalid session "<id>"`): it was invalidated.
    InvalidSession(String),
    /// The key is free but under the lock-delay of a session invalidated a moment ago
    /// (`failed to lock key "<key>" due to lock delay`).
    LockDelay(String),
    /// Another session holds the key (`failed to lock key "<key>", lock is already held`).
    AlreadyHeld(String),
    /// Any other reason (a failed `check-session`, among others).
    Other(String),
}

impl TxnRefusal {
    /// The refusal Consul's reasons `what` describe.
    pub(super) fn parse(what: String) -> TxnRefusal {
        if what.contains("invalid session") {
            TxnRefusal::InvalidSession(what)
        } else if what.contains("lock delay") {
            TxnRefusal::LockDelay(what)
        } else if what.contains("already held") {
            TxnRefusal::AlreadyHeld(what)
        } else {
            TxnRefusal::Other(what)
        }
    }

    /// Consul's reasons, as it gave them.
    pub(super) fn what(&self) -> &str {
        match self {
            TxnRefusal::InvalidSession(what)
            | TxnRefusal::LockDelay(what)
            | TxnRefusal::AlreadyHeld(what)
            | TxnRefusal::Other(what) => what,
        }
    }
}

impl fmt::Display for TxnRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what())
    }
}

/// A `/v1/txn` answer: applied (200), refused (409, its reasons parsed into a
/// [`TxnRefusal`]), or an error.
pub(super) fn parse_txn_answer(
    operation: &'static str,
    answer: &RawAnswer,
) -> Result<TxnOutcome, CoordinationError> {
    let parsed = || -> Result<TxnAnswer, CoordinationError> {
        serde_json::from_slice(&answer.body).map_err(|e| {
            unavailable(
                operation,
                format!(
                    "HTTP {}, unreadable txn answer ({e}): {}",
                    answer.status,
                    String::from_utf8_lossy(&answer.body).trim()
                ),
            )
        })
    };
    match answer.status {
        200 => Ok(TxnOutcome::Applied(
            parsed()?
                .results
                .unwrap_or_default()
                .into_iter()
                .filter_map(|r| r.kv)
                .collect(),
        )),
        409 => {
            let errors = parsed()?.errors.unwrap_or_default();
            let what: Vec<String> = errors.into_iter().map(|e| e.what).collect();
            Ok(TxnOutcome::Refused(TxnRefusal::parse(what.join("; "))))
        }
        status => Err(unavailable(
            operation,
            format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&answer.body).trim()
            ),
        )),
    }
}

pub(super) fn parse_kv_answer(
    operation: &'static str,
    answer: RawAnswer,
) -> Result<KvRead<KVPair>, CoordinationError> {
    let index = answer.index.ok_or_else(|| {
        unavailable(
            operation,
            format!("HTTP {} without an X-Consul-Index header", answer.status),
        )
    })?;
    match answer.status {
        404 => Ok(KvRead {
            index,
            entries: Vec::new(),
        }),
        200 => {
            let entries = serde_json::from_slice(&answer.body)
                .map_err(|e| unavailable(operation, format!("unreadable KV answer: {e}")))?;
            Ok(KvRead { index, entries })
        }
        status => Err(unavailable(
            operation,
            format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&answer.body).trim()
            ),
        )),
    }
}

/// The holder recorded in a KV entry, if it has a readable one.
pub(super) fn holder_of(entry: &KVPair) -> Option<HolderInfo> {
    let value = entry.value.clone()?;
    let bytes: Vec<u8> = match value.try_into() {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!(key = %entry.key, error = %describe(&e), "lock value is not base64");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(holder) => Some(holder),
        Err(e) => {
            tracing::warn!(key = %entry.key, error = %e, "lock value is not a HolderInfo");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::time::Duration;
    fn checked() -> ConsulLockConfig {
        ConsulLockConfig {
            instance: "gw-1".into(),
            check: Some(SessionCheck::tcp("127.0.0.1:50051")),
            ..ConsulLockConfig::default()
        }
    }
    #[test]
    fn the_registration_has_only_the_fields_consul_accepts() {
        let config = checked();
        let body = RegisterService::new(&config, config.check.as_ref().unwrap())
            .body()
            .unwrap()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "ID": "kafka-lease-gw-1",
                "Name": "kafka-lease",
                "Meta": {"instance": "gw-1", "check_tcp": "127.0.0.1:50051"},
                "Check": {
                    "CheckID": "kafka-lease-gw-1-alive",
                    "Name": "kafka-lease gateway gw-1 is alive",
                    "TCP": "127.0.0.1:50051",
                    "Interval": "1s",
                    "Timeout": "1s",
                    "DeregisterCriticalServiceAfter": "60s",
                    "Status": "passing",
                },
            })
        );
        let config = ConsulLockConfig {
            check: Some(SessionCheck::ttl(Duration::from_secs(1))),
            ..config
        };
        let body = RegisterService::new(&config, config.check.as_ref().unwrap())
            .body()
            .unwrap()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "ID": "kafka-lease-gw-1",
                "Name": "kafka-lease",
                "Meta": {"instance": "gw-1"},
                "Check": {
                    "CheckID": "kafka-lease-gw-1-alive",
                    "Name": "kafka-lease gateway gw-1 is alive",
                    "TTL": "1s",
                    "DeregisterCriticalServiceAfter": "60s",
                    "Status": "passing",
                },
            })
        );
    }
    #[test]
    fn a_txn_refusal_is_told_apart_by_consuls_reasons() {
        let parse = |what: &str| TxnRefusal::parse(what.to_string());
        assert_eq!(
            parse(r#"invalid session "6e3f40f7-1b3a-2c6d-9e07-3d2f4c1a8b90""#),
            TxnRefusal::InvalidSession(
                r#"invalid session "6e3f40f7-1b3a-2c6d-9e07-3d2f4c1a8b90""#.into()
            )
        );
        assert_eq!(
            parse(r#"failed to lock key "kafka-lease/g/t/0" due to lock delay"#),
            TxnRefusal::LockDelay(
                r#"failed to lock key "kafka-lease/g/t/0" due to lock delay"#.into()
            )
        );
        assert_eq!(
            parse(r#"failed to lock key "kafka-lease/g/t/0", lock is already held"#),
            TxnRefusal::AlreadyHeld(
                r#"failed to lock key "kafka-lease/g/t/0", lock is already held"#.into()
            )
        );
        for other in [
            r#"failed session check for key "kafka-lease/g/t/~members/m", current session "" != "s""#,
            r#"failed to check session, key "kafka-lease/g/t/~members/m" doesn't exist"#,
            "",
        ] {
            assert_eq!(parse(other), TxnRefusal::Other(other.into()));
        }
        // Several reasons in one text: the first case of the documented order wins.
        assert!(matches!(
            parse(r#"failed to lock key "a", lock is already held; invalid session "s""#),
            TxnRefusal::InvalidSession(_)
        ));
        assert!(matches!(
            parse(
                r#"failed to lock key "a", lock is already held; failed to lock key "b" due to lock delay"#
            ),
            TxnRefusal::LockDelay(_)
        ));
        // The text is kept for messages.
        let refusal = parse(r#"failed to lock key "k", lock is already held"#);
        assert_eq!(
            refusal.to_string(),
            r#"failed to lock key "k", lock is already held"#
        );
        assert_eq!(refusal.what(), refusal.to_string());
    }
    fn answer(status: u16, body: &str) -> RawAnswer {
        RawAnswer {
            status,
            index: None,
            body: body.as_bytes().to_vec(),
        }
    }
    #[test]
    fn a_txn_answer_is_applied_refused_or_an_error() {
        let applied = parse_txn_answer(
            "test",
            &answer(
                200,
                r#"{"Results":[{"KV":{"LockIndex":1,"Key":"p/g/t/0","Flags":0,"Value":null,
                    "Session":"s","CreateIndex":7,"ModifyIndex":9}}],"Errors":null}"#,
            ),
        )
        .unwrap();
        let TxnOutcome::Applied(entries) = applied else {
            panic!("not applied: {applied:?}");
        };
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].key, "p/g/t/0");
        assert_eq!(entries[0].modify_index, 9);
        assert_eq!(entries[0].session.as_deref(), Some("s"));

        let refused = parse_txn_answer(
            "test",
            &answer(
                409,
                r#"{"Results":null,"Errors":[{"OpIndex":0,
                    "What":"failed to lock key \"p/g/t/0\" due to lock delay"}]}"#,
            ),
        )
        .unwrap();
        let TxnOutcome::Refused(TxnRefusal::LockDelay(what)) = refused else {
            panic!("not refused for lock delay: {refused:?}");
        };
        assert_eq!(what, r#"failed to lock key "p/g/t/0" due to lock delay"#);

        let refused = parse_txn_answer(
            "test",
            &answer(
                409,
                r#"{"Errors":[{"OpIndex":0,"What":"one"},{"OpIndex":1,"What":"two"}]}"#,
            ),
        )
        .unwrap();
        let TxnOutcome::Refused(TxnRefusal::Other(what)) = refused else {
            panic!("not refused: {refused:?}");
        };
        assert_eq!(what, "one; two", "every reason, joined");

        let error = parse_txn_answer("test", &answer(500, " rpc error \n")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "lock backend unavailable during test: HTTP 500: rpc error"
        );
        let error = parse_txn_answer("test", &answer(409, "not json")).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("HTTP 409, unreadable txn answer"),
            "{error}"
        );
    }
}
