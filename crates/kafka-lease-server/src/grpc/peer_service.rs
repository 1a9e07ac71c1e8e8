//! `GatewayPeerService`: what other instances ask of this one.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use kafka_lease_proto::v1;
use kafka_lease_proto::v1::gateway_peer_service_server::GatewayPeerService;

use crate::auth::Auth;
use crate::coordination::{FencingToken, LockKey};
use crate::error::LeaseError;
use crate::gateway::Gateway;
use crate::validate;

use super::convert::*;
use super::status::*;

/// `GatewayPeerService` over a [`Gateway`]: what other instances ask of this one.
#[derive(Debug, Clone)]
pub struct PeerService {
    gateway: Arc<Gateway>,
    auth: Arc<Auth>,
}

impl PeerService {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        Self {
            gateway,
            auth: Auth::open(),
        }
    }

    /// Only gateway instances may call it, when identities exist (see [`Auth::check_gateway`]).
    pub fn with_auth(mut self, auth: Arc<Auth>) -> Self {
        self.auth = auth;
        self
    }
}

#[tonic::async_trait]
impl GatewayPeerService for PeerService {
    async fn describe_leases(
        &self,
        request: Request<v1::DescribeLeasesRequest>,
    ) -> Result<Response<v1::DescribeLeasesResponse>, Status> {
        let certs = request.peer_certs();
        self.auth
            .check_gateway(certs.as_deref().map(Vec::as_slice))
            .map_err(status_of)?;
        let asked = &request.get_ref().leases;
        if asked.len() > validate::MAX_PAGE_SIZE as usize {
            return Err(status_of(LeaseError::InvalidArgument {
                field: "leases",
                message: format!(
                    "{} leases asked for; at most {} at once",
                    asked.len(),
                    validate::MAX_PAGE_SIZE
                ),
            }));
        }
        let mut leases = Vec::new();
        for key in asked {
            validate::group(&key.group).map_err(status_of)?;
            validate::topic(&key.topic).map_err(status_of)?;
            let lock = LockKey::new(key.group.clone(), key.topic.clone(), key.partition);
            if let Some(live) = self
                .gateway
                .describe(&lock, FencingToken::from_wire(key.fencing_token))
            {
                leases.push(v1::LeaseInfo {
                    group: key.group.clone(),
                    topic: key.topic.clone(),
                    partition: key.partition,
                    fencing_token: key.fencing_token,
                    expires_at: Some(timestamp(live.expires_at)),
                    gateway: self.gateway.instance().to_string(),
                    position: Some(live.position),
                    committed_offset: live.committed,
                    high_watermark: Some(live.high_watermark),
                    lag: live.lag(),
                    read_lag: Some(live.read_lag()),
                    ..v1::LeaseInfo::default()
                });
            }
        }
        Ok(Response::new(v1::DescribeLeasesResponse { leases }))
    }
}
