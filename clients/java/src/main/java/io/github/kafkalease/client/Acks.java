package io.github.kafkalease.client;

import io.github.kafkalease.v1.AckOutcome;
import io.github.kafkalease.v1.AcknowledgeRequest;
import io.github.kafkalease.v1.AcknowledgeResponse;
import io.github.kafkalease.v1.Acknowledgement;
import io.grpc.stub.StreamObserver;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * A lease's answers on their way: at most one Acknowledge in flight, and the answers made
 * meanwhile go together in the next one, so a busy consumer sends few calls and an idle one
 * answers at once. No thread of its own: the next call starts from the previous one's
 * callback.
 */
final class Acks {
  /** The most acknowledgements one Acknowledge may carry. */
  private static final int MAX_BATCH = 10_000;

  private record Pending(Acknowledgement ack, CompletableFuture<Delivery.Outcome> reply) {}

  private final KafkaLeaseClient client;
  private final String leaseId;
  private final ArrayDeque<Pending> queue = new ArrayDeque<>();
  private boolean sending;

  Acks(KafkaLeaseClient client, String leaseId) {
    this.client = client;
    this.leaseId = leaseId;
  }

  /** Queues {@code ack}; the future completes with its outcome or the call's error. */
  CompletableFuture<Delivery.Outcome> send(Acknowledgement ack) {
    Pending pending = new Pending(ack, new CompletableFuture<>());
    List<Pending> batch = null;
    synchronized (this) {
      queue.add(pending);
      if (!sending) {
        sending = true;
        batch = take();
      }
    }
    if (batch != null) {
      dispatch(batch);
    }
    return pending.reply();
  }

  /** The next batch (caller holds the lock). */
  private List<Pending> take() {
    List<Pending> batch = new ArrayList<>(Math.min(queue.size(), MAX_BATCH));
    while (!queue.isEmpty() && batch.size() < MAX_BATCH) {
      batch.add(queue.poll());
    }
    return batch;
  }

  private void dispatch(List<Pending> batch) {
    AcknowledgeRequest.Builder request = AcknowledgeRequest.newBuilder().setLeaseId(leaseId);
    for (Pending p : batch) {
      request.addAcknowledgements(p.ack());
    }
    try {
      client
          .async()
          .acknowledge(
              request.build(),
              new StreamObserver<AcknowledgeResponse>() {
                private AcknowledgeResponse response;

                @Override
                public void onNext(AcknowledgeResponse value) {
                  response = value;
                }

                @Override
                public void onError(Throwable t) {
                  fail(batch, KafkaLeaseException.from(t));
                  next();
                }

                @Override
                public void onCompleted() {
                  for (int i = 0; i < batch.size(); i++) {
                    AckOutcome outcome =
                        response != null && i < response.getOutcomesCount()
                            ? response.getOutcomes(i)
                            : AckOutcome.ACK_OUTCOME_STALE;
                    batch.get(i).reply().complete(outcome(outcome));
                  }
                  next();
                }
              });
    } catch (RuntimeException e) {
      fail(batch, KafkaLeaseException.from(e));
      next();
    }
  }

  /**
   * The gateway's outcome; STALE for one this version does not know (it changed nothing this
   * client can tell).
   */
  static Delivery.Outcome outcome(AckOutcome outcome) {
    return switch (outcome) {
      case ACK_OUTCOME_APPLIED -> Delivery.Outcome.APPLIED;
      case ACK_OUTCOME_NOT_DELIVERED -> Delivery.Outcome.NOT_DELIVERED;
      default -> Delivery.Outcome.STALE;
    };
  }

  private static void fail(List<Pending> batch, KafkaLeaseException error) {
    for (Pending p : batch) {
      p.reply().completeExceptionally(error);
    }
  }

  /** Sends what queued up meanwhile, or goes idle. */
  private void next() {
    List<Pending> batch;
    synchronized (this) {
      if (queue.isEmpty()) {
        sending = false;
        return;
      }
      batch = take();
    }
    dispatch(batch);
  }
}
