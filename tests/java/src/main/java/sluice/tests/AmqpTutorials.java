package sluice.tests;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DeliverCallback;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.MessageProperties;

/**
 * RabbitMQ's six tutorials with RabbitMQ's Java client, as written there: hello world, work
 * queues, publish/subscribe, routing, topics, RPC. Prints "tutorial NAME ok" for each; any
 * mismatch ends with "FAIL: ..." and exit code 1.
 */
public final class AmqpTutorials {
    private static final long WAIT_S = 20;

    private AmqpTutorials() {}

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Check.args(argv);
        ConnectionFactory factory = new ConnectionFactory();
        factory.setHost(Check.req(args, "host"));
        factory.setPort(Integer.parseInt(Check.req(args, "port")));
        try (Connection connection = factory.newConnection()) {
            helloWorld(connection);
            workQueues(connection);
            publishSubscribe(connection);
            routing(connection);
            topics(connection);
            rpc(connection);
        } catch (Check.Failure failure) {
            System.err.println("FAIL: " + failure.getMessage());
            System.exit(1);
        }
    }

    private static String text(byte[] body) {
        return new String(body, StandardCharsets.UTF_8);
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    /** The bodies of `count` messages of `queue`, consumed with automatic acknowledgement. */
    private static List<String> receive(Channel channel, String queue, int count) throws Exception {
        List<String> got = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch done = new CountDownLatch(count);
        DeliverCallback callback = (tag, delivery) -> {
            got.add(text(delivery.getBody()));
            done.countDown();
        };
        String tag = channel.basicConsume(queue, true, callback, t -> { });
        Check.check(done.await(WAIT_S, TimeUnit.SECONDS), queue + ": " + got.size() + " of " + count + " arrived");
        channel.basicCancel(tag);
        return new ArrayList<>(got);
    }

    private static void helloWorld(Connection connection) throws Exception {
        try (Channel channel = connection.createChannel()) {
            channel.queueDeclare("hello", false, false, false, null);
            channel.basicPublish("", "hello", null, bytes("Hello World!"));
            Check.checkEq(List.of("Hello World!"), receive(channel, "hello", 1), "hello world");
        }
        Check.log("tutorial hello-world ok");
    }

    private static void workQueues(Connection connection) throws Exception {
        int tasks = 20;
        List<String> done = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch finished = new CountDownLatch(tasks);
        List<Channel> workers = new ArrayList<>();
        for (int w = 0; w < 2; w++) {
            Channel worker = connection.createChannel();
            worker.queueDeclare("task_queue", true, false, false, null);
            worker.basicQos(1);
            DeliverCallback callback = (tag, delivery) -> {
                done.add(text(delivery.getBody()));
                worker.basicAck(delivery.getEnvelope().getDeliveryTag(), false);
                finished.countDown();
            };
            worker.basicConsume("task_queue", false, callback, t -> { });
            workers.add(worker);
        }
        try (Channel channel = connection.createChannel()) {
            channel.confirmSelect();
            for (int i = 0; i < tasks; i++) {
                channel.basicPublish("", "task_queue", MessageProperties.PERSISTENT_TEXT_PLAIN, bytes("task " + i));
            }
            channel.waitForConfirmsOrDie(WAIT_S * 1000);
        }
        Check.check(finished.await(WAIT_S, TimeUnit.SECONDS), "work queues: " + done.size() + " of " + tasks + " done");
        for (Channel worker : workers) {
            worker.close();
        }
        Check.checkEq(tasks, (int) done.stream().distinct().count(), "each task done once");
        Check.log("tutorial work-queues ok");
    }

    private static void publishSubscribe(Connection connection) throws Exception {
        try (Channel channel = connection.createChannel()) {
            channel.exchangeDeclare("logs", "fanout");
            String first = channel.queueDeclare().getQueue();
            String second = channel.queueDeclare().getQueue();
            channel.queueBind(first, "logs", "");
            channel.queueBind(second, "logs", "");
            channel.basicPublish("logs", "", null, bytes("info: hello"));
            Check.checkEq(List.of("info: hello"), receive(channel, first, 1), "first subscriber");
            Check.checkEq(List.of("info: hello"), receive(channel, second, 1), "second subscriber");
        }
        Check.log("tutorial publish-subscribe ok");
    }

    private static void routing(Connection connection) throws Exception {
        try (Channel channel = connection.createChannel()) {
            channel.exchangeDeclare("direct_logs", "direct");
            String errors = channel.queueDeclare().getQueue();
            channel.queueBind(errors, "direct_logs", "error");
            for (String severity : List.of("info", "error", "warning")) {
                channel.basicPublish("direct_logs", severity, null, bytes(severity));
            }
            Check.checkEq(List.of("error"), receive(channel, errors, 1), "errors only");
        }
        Check.log("tutorial routing ok");
    }

    private static void topics(Connection connection) throws Exception {
        try (Channel channel = connection.createChannel()) {
            channel.exchangeDeclare("topic_logs", "topic");
            String kern = channel.queueDeclare().getQueue();
            channel.queueBind(kern, "topic_logs", "kern.*");
            channel.queueBind(kern, "topic_logs", "*.critical");
            for (String key : List.of("kern.critical", "cron.info", "auth.critical", "kern.info.extra")) {
                channel.basicPublish("topic_logs", key, null, bytes(key));
            }
            Check.checkEq(List.of("kern.critical", "auth.critical"), receive(channel, kern, 2), "kern.* and *.critical");
        }
        Check.log("tutorial topics ok");
    }

    private static int fib(int n) {
        return n < 2 ? n : fib(n - 1) + fib(n - 2);
    }

    private static void rpc(Connection connection) throws Exception {
        Channel server = connection.createChannel();
        server.queueDeclare("rpc_queue", false, false, false, null);
        server.queuePurge("rpc_queue");
        server.basicQos(1);
        DeliverCallback serve = (tag, delivery) -> {
            AMQP.BasicProperties reply = new AMQP.BasicProperties.Builder()
                    .correlationId(delivery.getProperties().getCorrelationId()).build();
            int n = Integer.parseInt(text(delivery.getBody()));
            server.basicPublish("", delivery.getProperties().getReplyTo(), reply, bytes(Integer.toString(fib(n))));
            server.basicAck(delivery.getEnvelope().getDeliveryTag(), false);
        };
        server.basicConsume("rpc_queue", false, serve, t -> { });
        try (Channel client = connection.createChannel()) {
            String replyQueue = client.queueDeclare().getQueue();
            String correlationId = UUID.randomUUID().toString();
            AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
                    .correlationId(correlationId).replyTo(replyQueue).build();
            client.basicPublish("", "rpc_queue", props, bytes("30"));
            BlockingQueue<String> answer = new ArrayBlockingQueue<>(1);
            String tag = client.basicConsume(replyQueue, true, (t, delivery) -> {
                if (correlationId.equals(delivery.getProperties().getCorrelationId())) {
                    answer.offer(text(delivery.getBody()));
                }
            }, t -> { });
            Check.checkEq("832040", answer.poll(WAIT_S, TimeUnit.SECONDS), "fib(30)");
            client.basicCancel(tag);
        }
        server.close();
        GetResponse none = connection.createChannel().basicGet("rpc_queue", true);
        Check.check(none == null, "the rpc queue is empty");
        Check.log("tutorial rpc ok");
    }
}
