//! The three calls whose responses carry records (Read, Subscribe, Deliver) written to the
//! connection from the batches' own buffers.
//!
//! tonic encodes each response of a stream into a buffer of its own before it frames it:
//! for a batch of records that the gateway has already written as protobuf
//! ([`Encoded`]), that is a second copy of every record (up to 256 KiB per response), into
//! a buffer that grows afresh for each batch. Here tonic still decodes the request, calls
//! the service and writes the response's headers (the calls behave exactly as tonic's
//! generated server makes them behave); only the body differs: [`FramedBody`] sends each
//! response as its 5-byte gRPC message header followed by the batch's own `Bytes`, which
//! HTTP/2 writes to the socket as they are. Short parts (under [`PIECE_AT_LEAST`]) are
//! still copied together, as tonic would, and so are short responses ready together.
//!
//! Every other call goes to tonic's generated server unchanged.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{self, Stream};
use http_body::Frame;
use kafka_lease_proto::encoded::partition_lease_service_server::{
    PartitionLeaseService, PartitionLeaseServiceServer,
};
use kafka_lease_proto::v1;
use kafka_lease_proto::wire::Encoded;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use super::LeaseService;

/// Parts of a response shorter than this are copied next to their neighbours rather than
/// sent as pieces of their own: each piece costs an HTTP/2 frame at least (16 KiB is h2's
/// default largest frame), and copying a few KiB costs less than a frame. A Read's or a
/// Subscribe's batch of records is one part; a Deliver response has three per record (a
/// head, the record, a tail), short unless the record is long.
const PIECE_AT_LEAST: usize = 16 * 1024;

/// The gRPC message header: a compression flag and the length, big-endian.
const HEADER_SIZE: usize = 5;

const READ: &str = "/kafka_lease.v1.PartitionLeaseService/Read";
const SUBSCRIBE: &str = "/kafka_lease.v1.PartitionLeaseService/Subscribe";
const DELIVER: &str = "/kafka_lease.v1.PartitionLeaseService/Deliver";

/// `PartitionLeaseService` as the gateway serves it: tonic's generated server, except that
/// Read, Subscribe and Deliver responses are framed by [`FramedBody`].
#[derive(Clone)]
pub struct FramedService {
    service: Arc<LeaseService>,
    generated: PartitionLeaseServiceServer<LeaseService>,
    max_request_bytes: usize,
}

impl FramedService {
    /// `service`, with requests of at most `max_request_bytes` (as tonic's
    /// `max_decoding_message_size`).
    pub fn new(service: LeaseService, max_request_bytes: usize) -> Self {
        let service = Arc::new(service);
        FramedService {
            generated: PartitionLeaseServiceServer::from_arc(service.clone())
                .max_decoding_message_size(max_request_bytes),
            service,
            max_request_bytes,
        }
    }
}

impl std::fmt::Debug for FramedService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FramedService")
            .field("max_request_bytes", &self.max_request_bytes)
            .finish_non_exhaustive()
    }
}

impl NamedService for FramedService {
    const NAME: &'static str = <PartitionLeaseServiceServer<LeaseService> as NamedService>::NAME;
}

impl<B> Service<http::Request<B>> for FramedService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service = self.service.clone();
        let limit = self.max_request_bytes;
        let path = request.uri().path().to_owned();
        match path.as_str() {
            READ => framed(request, limit, service, read),
            SUBSCRIBE => framed(request, limit, service, subscribe),
            DELIVER => framed(request, limit, service, deliver),
            _ => self.generated.call(request),
        }
    }
}

type Call<Req, S> = fn(Arc<LeaseService>, Request<Req>) -> BoxFuture<Response<S>, Status>;
type ReadStream = <LeaseService as PartitionLeaseService>::ReadStream;
type SubscribeStream = <LeaseService as PartitionLeaseService>::SubscribeStream;
type DeliverStream = <LeaseService as PartitionLeaseService>::DeliverStream;

fn read(
    service: Arc<LeaseService>,
    request: Request<v1::ReadRequest>,
) -> BoxFuture<Response<ReadStream>, Status> {
    Box::pin(async move { service.read(request).await })
}

fn subscribe(
    service: Arc<LeaseService>,
    request: Request<v1::SubscribeRequest>,
) -> BoxFuture<Response<SubscribeStream>, Status> {
    Box::pin(async move { service.subscribe(request).await })
}

fn deliver(
    service: Arc<LeaseService>,
    request: Request<v1::DeliverRequest>,
) -> BoxFuture<Response<DeliverStream>, Status> {
    Box::pin(async move { service.deliver(request).await })
}

/// One server-streaming call: tonic decodes the request and answers a refusal as it always
/// does; a stream of responses the call returns is taken aside and framed by
/// [`FramedBody`] under the headers tonic wrote.
fn framed<B, Req, M, S>(
    request: http::Request<B>,
    max_request_bytes: usize,
    service: Arc<LeaseService>,
    call: Call<Req, S>,
) -> BoxFuture<http::Response<Body>, Infallible>
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
    Req: prost::Message + Default + Send + 'static,
    M: Send + 'static,
    S: Stream<Item = Result<Encoded<M>, Status>> + Send + 'static,
{
    Box::pin(async move {
        let (taken, mut take) = tokio::sync::oneshot::channel();
        let mut grpc = Grpc::new(ProstCodec::<Encoded<M>, Req>::default())
            .apply_max_message_size_config(Some(max_request_bytes), None);
        let answer = grpc
            .server_streaming(
                TakeAside {
                    call: Some((service, call)),
                    taken: Some(taken),
                },
                request,
            )
            .await;
        Ok(match take.try_recv() {
            Ok(responses) => {
                let (parts, _empty) = answer.into_parts();
                http::Response::from_parts(parts, Body::new(FramedBody::new(responses)))
            }
            // Refused (tonic's answer carries the status) or never called.
            Err(_) => answer,
        })
    })
}

/// The call, for tonic: its stream of responses goes to `taken`, and tonic gets an empty
/// one (whose body is dropped).
struct TakeAside<Req, S> {
    call: Option<(Arc<LeaseService>, Call<Req, S>)>,
    taken: Option<tokio::sync::oneshot::Sender<S>>,
}

impl<Req, M, S> ServerStreamingService<Req> for TakeAside<Req, S>
where
    Req: Send + 'static,
    M: Send + 'static,
    S: Stream<Item = Result<Encoded<M>, Status>> + Send + 'static,
{
    type Response = Encoded<M>;
    type ResponseStream = stream::Empty<Result<Encoded<M>, Status>>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Req>) -> Self::Future {
        let call = self.call.take();
        let taken = self.taken.take();
        Box::pin(async move {
            let (Some((service, call)), Some(taken)) = (call, taken) else {
                return Err(Status::internal("the call was made twice"));
            };
            let (metadata, responses, extensions) = call(service, request).await?.into_parts();
            // The receiver is read right after this returns; it is gone only if the
            // request's future was dropped, and then nobody needs the stream.
            let _ = taken.send(responses);
            Ok(Response::from_parts(metadata, stream::empty(), extensions))
        })
    }
}

/// A stream of [`Encoded`] responses as a gRPC response body: each message's header, then
/// its long parts as they are (see [`PIECE_AT_LEAST`]); at the end, or at the
/// first error, the trailers with the status. Short messages that are ready together go out
/// in one piece of up to [`GATHER_UP_TO`] bytes, as tonic's encoder gathers them.
struct FramedBody<S> {
    responses: Pin<Box<S>>,
    /// Bytes copied together, not yet a piece.
    run: BytesMut,
    /// Pieces to send, in order.
    pieces: VecDeque<Bytes>,
    /// The status to end with, once the pieces are sent.
    status: Option<Status>,
    ended: bool,
}

/// Ready messages are gathered into one piece until it holds this much (tonic's
/// `yield_threshold`).
const GATHER_UP_TO: usize = 32 * 1024;

impl<S> FramedBody<S> {
    fn new(responses: S) -> Self {
        FramedBody {
            responses: Box::pin(responses),
            run: BytesMut::new(),
            pieces: VecDeque::new(),
            status: None,
            ended: false,
        }
    }

    /// What `run` holds, as the next piece.
    fn flush(&mut self) {
        if !self.run.is_empty() {
            self.pieces.push_back(self.run.split().freeze());
        }
    }

    /// `message`'s gRPC framing: its header and short parts copied into `run`, its long
    /// parts as pieces of their own.
    fn frame<M>(&mut self, message: Encoded<M>) -> Result<(), Status> {
        let len = message.len();
        let Ok(header_len) = u32::try_from(len) else {
            return Err(Status::resource_exhausted(format!(
                "a response of {len} bytes is more than a gRPC message can carry (4 GiB)"
            )));
        };
        self.run.reserve(HEADER_SIZE + len.min(PIECE_AT_LEAST));
        self.run.put_u8(0);
        self.run.put_u32(header_len);
        for part in message.into_parts() {
            if part.len() < PIECE_AT_LEAST {
                self.run.put_slice(&part);
            } else {
                self.flush();
                self.pieces.push_back(part);
            }
        }
        Ok(())
    }
}

impl<S, M> http_body::Body for FramedBody<S>
where
    S: Stream<Item = Result<Encoded<M>, Status>>,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if let Some(piece) = this.pieces.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        // Frame what is ready, until a long part or enough short bytes make a piece.
        while this.status.is_none() && this.pieces.is_empty() && this.run.len() < GATHER_UP_TO {
            match this.responses.as_mut().poll_next(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(Ok(message))) => {
                    if let Err(status) = this.frame(message) {
                        this.status = Some(status);
                    }
                }
                Poll::Ready(Some(Err(status))) => this.status = Some(status),
                Poll::Ready(None) => this.status = Some(Status::ok("")),
            }
        }
        this.flush();
        if let Some(piece) = this.pieces.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        let Some(status) = this.status.take() else {
            return Poll::Pending;
        };
        this.ended = true;
        let mut trailers = http::HeaderMap::with_capacity(3);
        Poll::Ready(Some(
            status
                .add_header(&mut trailers)
                .map(|()| Frame::trailers(trailers)),
        ))
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.pieces.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use prost::Message as _;

    fn records(sizes: &[usize]) -> v1::ReadResponse {
        v1::ReadResponse {
            records: sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| v1::KafkaRecord {
                    offset: i as i64,
                    value: Some(vec![i as u8; size].into()),
                    ..Default::default()
                })
                .collect(),
            high_watermark: 77,
            seek_epoch: 3,
            next_offset: sizes.len() as i64,
        }
    }

    /// The bytes and trailers a body sends, and the pieces it sent them in.
    async fn collect<S, M>(body: FramedBody<S>) -> (Vec<Bytes>, http::HeaderMap)
    where
        S: Stream<Item = Result<Encoded<M>, Status>> + Send + 'static,
        M: Send + 'static,
    {
        let mut body = std::pin::pin!(body);
        let mut pieces = Vec::new();
        let mut trailers = None;
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            let frame = frame.expect("a frame");
            match frame.into_data() {
                Ok(data) => pieces.push(data),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        assert!(body.is_end_stream());
        (pieces, trailers.expect("the trailers"))
    }

    /// The messages in a gRPC body's bytes.
    fn messages(pieces: &[Bytes]) -> Vec<v1::ReadResponse> {
        let all: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        let mut rest = &all[..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            assert_eq!(rest[0], 0, "not compressed");
            let len = u32::from_be_bytes(rest[1..5].try_into().expect("4 bytes")) as usize;
            out.push(v1::ReadResponse::decode(&rest[5..5 + len]).expect("a ReadResponse"));
            rest = &rest[5 + len..];
        }
        out
    }

    fn encoded(message: &v1::ReadResponse, split_at: &[usize]) -> Encoded<v1::ReadResponse> {
        let all = Bytes::from(message.encode_to_vec());
        let mut parts = Vec::new();
        let mut from = 0;
        for &at in split_at.iter().chain([all.len()].iter()) {
            parts.push(all.slice(from..at));
            from = at;
        }
        Encoded::from_parts(parts)
    }

    #[tokio::test]
    async fn large_parts_go_out_as_they_are_and_small_ones_with_their_header() {
        let big = records(&[100_000, 30_000]);
        let small = records(&[10, 20]);
        let big_encoded = encoded(&big, &[3, 700]);
        let big_part = big_encoded.clone().into_parts()[2].clone();
        let (pieces, trailers) = collect(FramedBody::new(stream::iter(vec![
            Ok(big_encoded),
            Ok(encoded(&small, &[5])),
        ])))
        .await;
        assert_eq!(messages(&pieces), vec![big.clone(), small]);
        // The large message: its header and two short parts copied together, then the
        // large part itself, not a copy of it; the short message in one piece.
        assert_eq!(pieces.len(), 3, "{pieces:?}");
        assert_eq!(pieces[0].len(), HEADER_SIZE + 700);
        assert_eq!(pieces[1].as_ptr(), big_part.as_ptr());
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
    }

    #[tokio::test]
    async fn short_messages_ready_together_go_out_in_one_piece() {
        let messages_in: Vec<v1::ReadResponse> = (0..100).map(|i| records(&[i % 7])).collect();
        let (pieces, trailers) = collect(FramedBody::new(stream::iter(
            messages_in
                .iter()
                .map(|m| Ok(encoded(m, &[1])))
                .collect::<Vec<_>>(),
        )))
        .await;
        assert_eq!(messages(&pieces), messages_in);
        assert_eq!(pieces.len(), 1, "{pieces:?}");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
        // Past GATHER_UP_TO, a new piece starts.
        let big_ones: Vec<v1::ReadResponse> = (0..20).map(|_| records(&[3000])).collect();
        let (pieces, _) = collect(FramedBody::new(stream::iter(
            big_ones
                .iter()
                .map(|m| Ok(encoded(m, &[])))
                .collect::<Vec<_>>(),
        )))
        .await;
        assert_eq!(messages(&pieces), big_ones);
        assert!(pieces.len() > 1, "{}", pieces.len());
        assert!(pieces
            .iter()
            .all(|p| p.len() < GATHER_UP_TO + PIECE_AT_LEAST));
    }

    #[tokio::test]
    async fn a_message_of_many_short_parts_goes_out_copied_in_one_piece() {
        // As a Deliver response is: a head, a record and a tail for each record.
        let message = records(&[1900; 8]);
        let all = message.encode_to_vec();
        let cuts: Vec<usize> = (1..all.len() / 2000).map(|i| i * 2000).collect();
        let encoded = encoded(&message, &cuts);
        assert!(encoded.clone().into_parts().len() >= 7);
        let (pieces, _) = collect(FramedBody::new(stream::iter(vec![Ok(encoded)]))).await;
        assert_eq!(messages(&pieces), vec![message]);
        assert_eq!(pieces.len(), 1, "{}", pieces.len());
    }

    #[tokio::test]
    async fn an_error_ends_the_body_with_its_status_after_what_came_before() {
        let first = records(&[5000]);
        let (pieces, trailers) = collect(FramedBody::new(stream::iter(vec![
            Ok(encoded(&first, &[])),
            Err(Status::aborted("superseded by a newer Read")),
            Ok(encoded(&records(&[1]), &[])),
        ])))
        .await;
        assert_eq!(messages(&pieces), vec![first]);
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"10"[..])
        );
        assert_eq!(
            trailers.get("grpc-message").map(|v| v.as_bytes()),
            Some(&b"superseded%20by%20a%20newer%20Read"[..])
        );
    }

    #[tokio::test]
    async fn an_empty_stream_sends_only_its_trailers() {
        let (pieces, trailers) = collect(FramedBody::new(stream::iter(Vec::<
            Result<Encoded<v1::ReadResponse>, Status>,
        >::new())))
        .await;
        assert!(pieces.is_empty());
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
        // An empty message still has its header.
        let (pieces, _) = collect(FramedBody::new(stream::iter(vec![Ok(Encoded::<
            v1::ReadResponse,
        >::default(
        ))])))
        .await;
        assert_eq!(pieces, vec![Bytes::from_static(&[0, 0, 0, 0, 0])]);
    }
}
