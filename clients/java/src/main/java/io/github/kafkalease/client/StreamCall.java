package io.github.kafkalease.client;

import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;

/**
 * A server-streaming call read one message at a time with a timeout: the async stub with flow
 * control (one message requested at a time, so a slow reader applies backpressure), and a
 * queue between the gRPC threads and the reader. Single reader; {@link #cancel} from any thread.
 */
final class StreamCall<Q, R> {
  /** What {@link #take} returns when the call ended with OK or was cancelled by us. */
  static final Object END = new Object();

  /** Queued by {@link #wake}: {@link #take} returns null, as on a timeout. */
  private static final Object WAKE = new Object();

  private record Failure(Throwable error) {}

  private final BlockingQueue<Object> queue = new LinkedBlockingQueue<>();
  private volatile ClientCallStreamObserver<Q> call;
  private volatile boolean cancelled;
  private boolean ended;

  private StreamCall() {}

  static <Q, R> StreamCall<Q, R> start(BiConsumer<Q, StreamObserver<R>> method, Q request) {
    StreamCall<Q, R> stream = new StreamCall<>();
    method.accept(request, stream.new Observer());
    return stream;
  }

  private final class Observer implements ClientResponseObserver<Q, R> {
    @Override
    public void beforeStart(ClientCallStreamObserver<Q> requestStream) {
      call = requestStream;
      requestStream.disableAutoRequestWithInitial(1);
    }

    @Override
    public void onNext(R value) {
      queue.add(value);
    }

    @Override
    public void onError(Throwable t) {
      queue.add(new Failure(t));
    }

    @Override
    public void onCompleted() {
      queue.add(END);
    }
  }

  /**
   * The next message, {@link #END}, or null if nothing came within {@code timeout} (null:
   * wait as long as it takes).
   *
   * @throws StatusRuntimeException the status the call ended with (not after {@link #cancel})
   */
  Object take(Duration timeout) throws InterruptedException {
    if (ended || cancelled) {
      ended = true;
      return END;
    }
    Object item =
        timeout == null ? queue.take() : queue.poll(timeout.toNanos(), TimeUnit.NANOSECONDS);
    if (item == null || item == WAKE) {
      return null;
    }
    if (cancelled || item == END) {
      ended = true;
      return END;
    }
    if (item instanceof Failure failure) {
      ended = true;
      if (failure.error() instanceof RuntimeException e) {
        throw e;
      }
      throw new StatusRuntimeException(io.grpc.Status.fromThrowable(failure.error()));
    }
    call.request(1);
    return item;
  }

  /**
   * The messages that have arrived and were not taken, without asking for more; for a reader
   * about to {@link #cancel} the call (an end or error among them is dropped).
   */
  @SuppressWarnings("unchecked")
  List<R> drainArrived() {
    List<R> out = new ArrayList<>();
    Object item;
    while ((item = queue.poll()) != null) {
      if (item != END && item != WAKE && !(item instanceof Failure)) {
        out.add((R) item);
      }
    }
    return out;
  }

  /** Makes a blocked (or the next) {@link #take} return null at once; the call goes on. */
  void wake() {
    queue.add(WAKE);
  }

  /** Ends the call (RST_STREAM to the server); a blocked {@link #take} returns {@link #END}. */
  void cancel() {
    cancelled = true;
    ClientCallStreamObserver<Q> c = call;
    if (c != null) {
      c.cancel("cancelled by the client", null);
    }
    queue.add(END);
  }
}
