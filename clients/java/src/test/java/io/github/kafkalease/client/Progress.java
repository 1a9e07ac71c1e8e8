package io.github.kafkalease.client;

import java.util.Optional;
import org.junit.jupiter.api.extension.ExtensionContext;
import org.junit.jupiter.api.extension.TestWatcher;

/** Prints one line per test as it ends, so that test.sh shows progress. */
public final class Progress implements TestWatcher {
  private static void line(ExtensionContext c, String outcome, String why) {
    System.out.printf(
        "[java] %-7s %s.%s%s%n",
        outcome,
        c.getRequiredTestClass().getSimpleName(),
        c.getDisplayName().replace("()", ""),
        why == null ? "" : ": " + why);
    System.out.flush();
  }

  @Override
  public void testSuccessful(ExtensionContext c) {
    line(c, "ok", null);
  }

  @Override
  public void testFailed(ExtensionContext c, Throwable cause) {
    line(c, "FAILED", String.valueOf(cause.getMessage()));
  }

  @Override
  public void testAborted(ExtensionContext c, Throwable cause) {
    line(c, "skipped", cause.getMessage());
  }

  @Override
  public void testDisabled(ExtensionContext c, Optional<String> reason) {
    line(c, "skipped", reason.orElse(null));
  }
}
