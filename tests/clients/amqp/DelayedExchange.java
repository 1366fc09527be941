// The RabbitMQ JMS client's delivery delay (JMS 2.0 setDeliveryDelay), made with the calls it
// makes, through the bridge, with the RabbitMQ Java client (Debian's librabbitmq-client-java):
// declare x.delayed.jms.message (x-delayed-message, x-delayed-type headers), bind the
// destination exchange to it on delayed-exchange, publish with x-delay and delayed-exchange.
// Prints one line of JSON. Run as a single-file program:
//   java -cp /usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar DelayedExchange.java PORT EXCHANGE QUEUE DELAY_MS
import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.GetResponse;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

public class DelayedExchange {
    static final String DELAYED = "x.delayed.jms.message";

    public static void main(String[] args) throws Exception {
        String exchange = args[1];
        String queue = args[2];
        int delay = Integer.parseInt(args[3]);
        ConnectionFactory factory = new ConnectionFactory();
        factory.setHost("127.0.0.1");
        factory.setPort(Integer.parseInt(args[0]));
        factory.setUsername("guest");
        factory.setPassword("guest");
        factory.setAutomaticRecoveryEnabled(false);
        try (Connection conn = factory.newConnection()) {
            Channel ch = conn.createChannel();
            Map<String, Object> type = new HashMap<>();
            type.put("x-delayed-type", "headers");
            ch.exchangeDeclare(DELAYED, "x-delayed-message", true, false, type);
            ch.exchangeDeclare(exchange, "direct", true, false, null);
            ch.queueDeclare(queue, true, false, false, null);
            ch.queueBind(queue, exchange, queue);
            Map<String, Object> on = new HashMap<>();
            on.put("delayed-exchange", exchange);
            ch.exchangeBind(exchange, DELAYED, "", on);
            ch.confirmSelect();
            Map<String, Object> headers = new HashMap<>();
            headers.put("x-delay", delay);
            headers.put("delayed-exchange", exchange);
            long sent = System.currentTimeMillis();
            ch.basicPublish(DELAYED, queue,
                            new AMQP.BasicProperties.Builder().headers(headers).build(),
                            "jms later".getBytes(StandardCharsets.UTF_8));
            ch.waitForConfirmsOrDie(5000);
            boolean early = ch.basicGet(queue, true) != null;
            GetResponse r = null;
            long deadline = sent + delay + 15000;
            while (r == null && System.currentTimeMillis() < deadline) {
                r = ch.basicGet(queue, true);
                if (r == null) Thread.sleep(20);
            }
            long waited = System.currentTimeMillis() - sent;
            String body = r == null ? null : new String(r.getBody(), StandardCharsets.UTF_8);
            Object xDelay = r == null ? null : r.getProps().getHeaders().get("x-delay");
            System.out.println("{\"early\":" + early + ",\"body\":"
                + (body == null ? "null" : "\"" + body + "\"") + ",\"waited_ms\":" + waited
                + ",\"x_delay\":" + xDelay + ",\"x_delay_type\":\""
                + (xDelay == null ? "" : xDelay.getClass().getSimpleName()) + "\"}");
        }
    }
}
