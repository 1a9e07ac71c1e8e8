package io.github.kafkalease.client;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;

/** A loopback TCP relay to a target, whose connections can be cut while it keeps accepting. */
final class TcpRelay implements AutoCloseable {
  private final ServerSocket server;
  private final String targetHost;
  private final int targetPort;
  private final List<Socket> sockets = new CopyOnWriteArrayList<>();
  private final AtomicInteger accepted = new AtomicInteger();

  TcpRelay(String target) throws IOException {
    int colon = target.lastIndexOf(':');
    this.targetHost = target.substring(0, colon);
    this.targetPort = Integer.parseInt(target.substring(colon + 1));
    this.server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
    Thread t = new Thread(this::acceptLoop, "relay-accept");
    t.setDaemon(true);
    t.start();
  }

  String address() {
    return "127.0.0.1:" + server.getLocalPort();
  }

  int accepted() {
    return accepted.get();
  }

  /** Closes every relayed connection (both sides); new ones are still accepted. */
  void cutAll() {
    for (Socket s : sockets) {
      try {
        s.close();
      } catch (IOException ignored) {
        // closing anyway
      }
    }
    sockets.clear();
  }

  private void acceptLoop() {
    while (!server.isClosed()) {
      try {
        Socket client = server.accept();
        accepted.incrementAndGet();
        Socket upstream = new Socket();
        upstream.connect(new InetSocketAddress(targetHost, targetPort), 5000);
        sockets.add(client);
        sockets.add(upstream);
        pump(client, upstream);
        pump(upstream, client);
      } catch (IOException e) {
        // the server socket closed, or the target refused: next
      }
    }
  }

  private void pump(Socket from, Socket to) {
    Thread t =
        new Thread(
            () -> {
              byte[] buf = new byte[16384];
              try (InputStream in = from.getInputStream(); OutputStream out = to.getOutputStream()) {
                int n;
                while ((n = in.read(buf)) >= 0) {
                  out.write(buf, 0, n);
                  out.flush();
                }
              } catch (IOException ignored) {
                // cut
              } finally {
                try {
                  from.close();
                  to.close();
                } catch (IOException ignored) {
                  // closing anyway
                }
              }
            },
            "relay-pump");
    t.setDaemon(true);
    t.start();
  }

  @Override
  public void close() throws IOException {
    server.close();
    cutAll();
  }
}
