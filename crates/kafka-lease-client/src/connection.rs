//! What every handle of one gateway connection calls through ([`Connection`]): the HTTP/2
//! channel, the bearer token sent with each call, and the largest response accepted. The
//! [`crate::Client`], its leases and its subscriptions each hold one, so none of them needs
//! another to make its calls.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;

use kafka_lease_proto::v1::partition_lease_service_client::PartitionLeaseServiceClient;

/// The largest response the client accepts by default: 64 MiB.
///
/// tonic's own default (4 MiB) is too small for the gateway's largest batches: `max_bytes`
/// (up to 4 MiB) counts only keys, values and headers, not the protobuf framing around them,
/// and a single record larger than `max_bytes` is sent alone.
pub const DEFAULT_MAX_DECODING_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// One gateway connection as every call goes out on it. Cheap to clone: clones share the
/// channel.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    channel: Channel,
    pub(crate) credentials: Credentials,
    pub(crate) max_decoding_message_size: usize,
}

impl Connection {
    pub(crate) fn new(channel: Channel) -> Connection {
        Connection {
            channel,
            credentials: Credentials::default(),
            max_decoding_message_size: DEFAULT_MAX_DECODING_MESSAGE_SIZE,
        }
    }

    /// The generated gRPC client over this connection, with its bearer token.
    pub(crate) fn raw(&self) -> PartitionLeaseServiceClient<Transport> {
        PartitionLeaseServiceClient::with_interceptor(
            self.channel.clone(),
            self.credentials.clone(),
        )
        .max_decoding_message_size(self.max_decoding_message_size)
    }
}

/// What the generated client runs over: the channel, with the bearer token (if any) added
/// to every call.
pub type Transport = InterceptedService<Channel, Credentials>;

/// The per-call credentials: the bearer token, sent as `authorization: Bearer <token>`.
/// Its `Debug` never shows the token.
#[derive(Clone, Default)]
pub struct Credentials {
    pub(crate) bearer: Option<MetadataValue<Ascii>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("bearer", &self.bearer.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(bearer) = &self.bearer {
            request
                .metadata_mut()
                .insert("authorization", bearer.clone());
        }
        Ok(request)
    }
}
