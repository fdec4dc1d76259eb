package sluice.tests;

import java.util.HashMap;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.common.KafkaFuture;

/** Small helpers shared by the test programs: argument parsing, assertions, futures with timeouts. */
final class Check {
    private Check() {}

    /** Thrown on any mismatch; main() turns it into "FAIL: ..." on stderr and exit code 1. */
    static final class Failure extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Failure(String msg) {
            super(msg);
        }

        Failure(String msg, Throwable cause) {
            super(msg, cause);
        }
    }

    static Failure fail(String msg) {
        throw new Failure(msg);
    }

    static void check(boolean cond, String msg) {
        if (!cond) throw new Failure(msg);
    }

    static void checkEq(Object expected, Object actual, String what) {
        if (!Objects.equals(expected, actual)) {
            throw new Failure(what + ": expected <" + expected + "> but got <" + actual + ">");
        }
    }

    /** Waits for an admin future; an exception is reported as a failure naming the operation. */
    static <T> T get(KafkaFuture<T> f, String what) {
        try {
            return f.get(60, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            throw new Failure(what + " failed: " + e.getCause(), e.getCause());
        } catch (java.util.concurrent.TimeoutException e) {
            throw new Failure(what + " timed out after 60 s", e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new Failure(what + " interrupted", e);
        }
    }

    /** Expects an admin future to fail with the given exception class; returns the cause. */
    static Throwable expectFailure(KafkaFuture<?> f, Class<? extends Throwable> cls, String what) {
        try {
            Object v = f.get(60, TimeUnit.SECONDS);
            throw new Failure(what + ": expected " + cls.getSimpleName() + " but it succeeded with " + v);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (!cls.isInstance(cause)) {
                throw new Failure(what + ": expected " + cls.getSimpleName() + " but got " + cause, cause);
            }
            return cause;
        } catch (java.util.concurrent.TimeoutException e) {
            throw new Failure(what + " timed out after 60 s", e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new Failure(what + " interrupted", e);
        }
    }

    /** Parses "--name value" pairs and bare "--flag"s. */
    static Map<String, String> args(String[] argv) {
        Map<String, String> out = new HashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String a = argv[i];
            if (!a.startsWith("--")) throw new IllegalArgumentException("unexpected argument " + a);
            String name = a.substring(2);
            if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) {
                out.put(name, argv[++i]);
            } else {
                out.put(name, "true");
            }
        }
        return out;
    }

    static String req(Map<String, String> args, String name) {
        String v = args.get(name);
        if (v == null) throw new IllegalArgumentException("missing --" + name);
        return v;
    }

    static void log(String msg) {
        System.out.println(msg);
        System.out.flush();
    }
}
