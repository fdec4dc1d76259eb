package sluice.tests;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueBytesStoreSupplier;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * A Kafka Streams word count, driven by tests/python/test_streams.py, which kills it with SIGKILL
 * mid-stream and starts it again with the same application.id and state dir.
 *
 * <p>Topology: lines (String values, any key) from --input, split on spaces, re-keyed by word
 * through the repartition topic {@code <app>-words-repartition}, counted in the state store
 * "counts" (RocksDB, or in memory with --store memory), backed by the compacted changelog
 * {@code <app>-counts-changelog} that Streams creates itself; every update of a count goes to
 * --output (key: the word as UTF-8, value: the count as an 8-byte big-endian long). The record
 * cache is off, so each input word yields exactly one output record: with exactly-once, a
 * read_committed reader sees the counts 1, 2, .., N of each word, in order, nothing twice.
 *
 * <pre>
 * --bootstrap HOST:PORT --application-id ID --input T --output T --state-dir DIR
 * [--guarantee exactly_once_v2|at_least_once] [--store rocksdb|memory] [--throttle-ms N]
 * [--commit-interval-ms N] [--props "k=v;k=v"]
 * </pre>
 * --props sets more Streams (and prefixed client) configs.
 * --throttle-ms sleeps that long per counted word (between the count and its output record), so
 * that a test's kill lands while transactions carry output and changelog records.
 *
 * <p>stdout, one event per line: {@code STATE <new> <old>} on every state change (the test waits
 * for {@code STATE RUNNING}); {@code PROGRESS lines=<n>} every 100 input lines and
 * {@code COUNTED words=<n>} every 100 words counted by this JVM (aborted work included);
 * {@code UNCAUGHT <exception>} if a stream thread dies (the client is then shut down);
 * {@code CLOSED <final state> lines=<n> words=<n>} after a close, triggered by the stdin line
 * {@code close}, by stdin's end or by SIGTERM. Exit code 0 after a clean close from a non-error
 * state, 1 otherwise.
 */
public final class StreamsWordCount {
    private StreamsWordCount() {}

    private static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> a = Check.args(argv);
        String input = Check.req(a, "input");
        String output = Check.req(a, "output");
        long throttleMs = Long.parseLong(a.getOrDefault("throttle-ms", "0"));
        boolean inMemory = a.getOrDefault("store", "rocksdb").equals("memory");

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, Check.req(a, "application-id"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, Check.req(a, "bootstrap"));
        p.put(StreamsConfig.STATE_DIR_CONFIG, Check.req(a, "state-dir"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, a.getOrDefault("guarantee", StreamsConfig.EXACTLY_ONCE_V2));
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, a.getOrDefault("commit-interval-ms", "100"));
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        // No record cache: every update of a count is forwarded (and logged to the changelog).
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");
        // A killed instance leaves the group after 6 s (Streams' default is 45 s).
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), "6000");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), "1000");
        // Reconnect quickly to a restarted broker.
        p.put(StreamsConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, "1000");
        p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), "5");
        for (String extra : a.getOrDefault("props", "").split(";")) {
            int eq = extra.indexOf('=');
            if (eq > 0) p.put(extra.substring(0, eq), extra.substring(eq + 1));
        }

        AtomicLong lines = new AtomicLong();
        AtomicLong counted = new AtomicLong();
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> source = builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()));
        Materialized<String, Long, KeyValueStore<Bytes, byte[]>> store;
        if (inMemory) {
            KeyValueBytesStoreSupplier supplier = Stores.inMemoryKeyValueStore("counts");
            store = Materialized.as(supplier);
        } else {
            store = Materialized.as("counts");
        }
        source
                .peek((k, line) -> {
                    long n = lines.incrementAndGet();
                    if (n % 100 == 0) emit("PROGRESS lines=" + n);
                })
                .flatMapValues(line -> Arrays.asList(line.split(" ")))
                .filter((k, word) -> !word.isEmpty())
                .groupBy((k, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
                .count(store.withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
                .toStream()
                .peek((word, count) -> {
                    long n = counted.incrementAndGet();
                    if (n % 100 == 0) emit("COUNTED words=" + n);
                    if (throttleMs > 0) {
                        try {
                            Thread.sleep(throttleMs);
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                    }
                })
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), p);
        CountDownLatch stop = new CountDownLatch(1);
        streams.setStateListener((now, before) -> emit("STATE " + now + " " + before));
        streams.setUncaughtExceptionHandler(e -> {
            emit("UNCAUGHT " + e);
            e.printStackTrace();
            stop.countDown();
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });

        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                for (String line; (line = in.readLine()) != null; ) {
                    if (line.trim().equals("close")) break;
                }
            } catch (Exception e) {
                // stdin gone: close as well
            }
            stop.countDown();
        }, "stdin");
        stdin.setDaemon(true);
        CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stop.countDown();
            try {
                closed.await(60, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }, "shutdown"));

        streams.start();
        stdin.start();
        stop.await();
        KafkaStreams.State last = streams.state();
        boolean clean = streams.close(Duration.ofSeconds(60));
        KafkaStreams.State end = streams.state();
        emit("CLOSED " + end + " lines=" + lines.get() + " words=" + counted.get());
        closed.countDown();
        System.out.flush();
        System.err.flush();
        boolean ok = clean && last != KafkaStreams.State.ERROR && last != KafkaStreams.State.PENDING_ERROR
                && end == KafkaStreams.State.NOT_RUNNING;
        Runtime.getRuntime().halt(ok ? 0 : 1);
    }
}
