// @kafka-lease/client: a thin wrapper over the generated stubs (./gen, usable on their own).
export { Client, DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH } from "./client";
export type { AcquireOptions, ConnectOptions, Reset, SubscribeOptions } from "./client";
export { Code, KafkaLeaseError, toKafkaLeaseError } from "./errors";
export type { ReasonName } from "./errors";
export { EpochFilter, Lease, LeaseHandle, RecordStream } from "./lease";
export type { ReadOptions, SeekTo } from "./lease";
export type { Batch, KafkaLeaseRecord } from "./records";
export {
  Delivery,
  DeliveryStream,
  RejectError,
  RetryError,
  defaultErrorPolicy,
} from "./queue";
export type {
  AckOutcome,
  Answer,
  ConsumeOptions,
  ConsumerOptions,
  ConsumeStats,
  ErrorPolicy,
  Failure,
  Handler,
  HandlerContext,
  Ordering,
  QueueOptions,
  SubscribeQueueOptions,
} from "./queue";
export { Partition, Subscription } from "./subscription";
export type { SubscriptionConsumeOptions, SubscriptionEvent } from "./subscription";
export { ERROR_DOMAIN, decodeStatusDetails, statusDetailsFromMetadata } from "./status";
export type { StatusDetails } from "./status";
export type { CallOpts, OffsetLike } from "./convert";
export * as proto from "./gen/kafka_lease/v1/partition_lease";
export { ErrorReason } from "./gen/kafka_lease/v1/errors";
export { DeliveryOrder, TimestampType } from "./gen/kafka_lease/v1/partition_lease";
export type { LeaseInfo, MemberInfo, QueueInfo } from "./gen/kafka_lease/v1/partition_lease";
