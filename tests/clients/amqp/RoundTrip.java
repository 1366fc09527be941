// One AMQP 0-9-1 round trip through the bridge with the RabbitMQ Java client (Debian's
// librabbitmq-client-java), for tests/integration: confirms, a transaction rolled back then
// committed, a delayed publish, a nack with requeue (its redelivery counted) and a refused
// publish. Prints one line of JSON. Run as a single-file program:
//   java -cp /usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar RoundTrip.java PORT QUEUE
import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.ShutdownSignalException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

public class RoundTrip {
    static String queue;

    static GetResponse get(Channel ch, long timeoutMs) throws Exception {
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (System.currentTimeMillis() < deadline) {
            GetResponse r = ch.basicGet(queue, false);
            if (r != null) return r;
            Thread.sleep(20);
        }
        return null;
    }

    static String body(GetResponse r) {
        return r == null ? null : new String(r.getBody(), StandardCharsets.UTF_8);
    }

    static Object count(GetResponse r) {
        return r == null ? null : r.getProps().getHeaders().get("JMSXDeliveryCount");
    }

    static String quote(String s) {
        return s == null ? "null" : "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    public static void main(String[] args) throws Exception {
        queue = args[1];
        ConnectionFactory factory = new ConnectionFactory();
        factory.setHost("127.0.0.1");
        factory.setPort(Integer.parseInt(args[0]));
        factory.setUsername("guest");
        factory.setPassword("guest");
        factory.setAutomaticRecoveryEnabled(false);
        StringBuilder out = new StringBuilder("{");
        try (Connection conn = factory.newConnection()) {
            Channel ch = conn.createChannel();
            ch.queueDeclare(queue, true, false, false, null);
            ch.confirmSelect();
            Map<String, Object> headers = new HashMap<>();
            headers.put("n", 1);
            ch.basicPublish("", queue, new AMQP.BasicProperties.Builder().headers(headers).build(),
                            "plain".getBytes(StandardCharsets.UTF_8));
            ch.waitForConfirmsOrDie(5000);
            GetResponse r = get(ch, 5000);
            out.append("\"plain\":").append(quote(body(r)))
               .append(",\"plain_count\":").append(count(r))
               .append(",\"n\":").append(r.getProps().getHeaders().get("n"));
            ch.basicNack(r.getEnvelope().getDeliveryTag(), false, true);
            r = get(ch, 5000);
            out.append(",\"nacked_count\":").append(count(r));
            ch.basicAck(r.getEnvelope().getDeliveryTag(), false);

            Channel tx = conn.createChannel();
            tx.txSelect();
            tx.basicPublish("", queue, null, "rolled back".getBytes(StandardCharsets.UTF_8));
            tx.txRollback();
            tx.basicPublish("", queue, null, "committed".getBytes(StandardCharsets.UTF_8));
            tx.txCommit();
            r = get(ch, 5000);
            out.append(",\"tx\":").append(quote(body(r)));
            ch.basicAck(r.getEnvelope().getDeliveryTag(), false);
            out.append(",\"tx_left\":").append(ch.messageCount(queue));

            Map<String, Object> delay = new HashMap<>();
            delay.put("x-delay", 600);
            long sent = System.currentTimeMillis();
            ch.basicPublish("", queue, new AMQP.BasicProperties.Builder().headers(delay).build(),
                            "later".getBytes(StandardCharsets.UTF_8));
            ch.waitForConfirmsOrDie(5000);
            out.append(",\"early\":").append(ch.basicGet(queue, true) != null);
            r = get(ch, 10000);
            out.append(",\"delayed\":").append(quote(body(r)))
               .append(",\"waited_ms\":").append(System.currentTimeMillis() - sent);
            ch.basicAck(r.getEnvelope().getDeliveryTag(), false);

            Channel refused = conn.createChannel();
            refused.confirmSelect();
            Map<String, Object> bad = new HashMap<>();
            bad.put("x-delay", -5);
            String refusal = null;
            try {
                refused.basicPublish("", queue,
                                     new AMQP.BasicProperties.Builder().headers(bad).build(),
                                     "no".getBytes(StandardCharsets.UTF_8));
                refused.waitForConfirmsOrDie(5000);
            } catch (ShutdownSignalException | java.io.IOException e) {
                ShutdownSignalException s = e instanceof ShutdownSignalException
                    ? (ShutdownSignalException) e : (ShutdownSignalException) e.getCause();
                AMQP.Channel.Close close = (AMQP.Channel.Close) s.getReason();
                refusal = close.getReplyCode() + " " + close.getReplyText();
            }
            out.append(",\"refused\":").append(quote(refusal));
        }
        System.out.println(out.append("}"));
    }
}
