import java.lang.management.ManagementFactory;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import javax.jms.BytesMessage;
import javax.jms.DeliveryMode;
import javax.jms.JMSException;
import javax.jms.MapMessage;
import javax.jms.Message;
import javax.jms.MessageConsumer;
import javax.jms.MessageProducer;
import javax.jms.Session;
import javax.jms.TemporaryQueue;
import org.apache.activemq.ActiveMQConnection;
import org.apache.activemq.ActiveMQConnectionFactory;
import org.apache.activemq.ActiveMQMessageProducer;
import org.apache.activemq.AsyncCallback;
import org.apache.activemq.command.ActiveMQQueue;

/** Phases (publish-tx, publish-async, move, sizes, destroy), one or several joined by "+" in one
 *  run (a JVM start less each); one JSON line out for each. Usage: Ceiling URL PHASE[+PHASE...]
 *  SRC DST COUNT BATCH THREADS SIZE. Each thread has a connection of its own (two sessions on
 *  one connection stalled here once, the broker no longer reading).
 *  A received message is sent on as it is: the client copies it on send (copyMessageOnSend,
 *  the default; without the copy the send renames the message and its ack names the copy). */
public class Ceiling {
    interface Work { void run(int part) throws Exception; }

    public static void main(String[] a) throws Exception {
        String url = a[0], src = a[2], dst = a[3];
        int count = Integer.parseInt(a[4]), batch = Integer.parseInt(a[5]);
        int threads = Integer.parseInt(a[6]), size = Integer.parseInt(a[7]);
        ActiveMQConnection c = connect(url);
        for (String phase : a[1].split("\\+")) {
            run(c, url, phase, src, dst, count, batch, threads, size);
        }
        c.close();
    }

    static void run(ActiveMQConnection c, String url, String phase, String src, String dst,
                    int count, int batch, int threads, int size) throws Exception {
        if (phase.equals("sizes")) {
            System.out.printf("{\"%s\": %d, \"%s\": %d}%n", src, size(c, src), dst, size(c, dst));
        } else if (phase.equals("destroy")) {
            c.destroyDestination(new ActiveMQQueue(src));
            c.destroyDestination(new ActiveMQQueue(dst));
            System.out.println("{}");
        } else {
            AtomicInteger moved = new AtomicInteger();
            Work w;
            switch (phase) {
                case "publish-tx":
                    w = part -> publishTx(connect(url), src,
                            share(count, threads, part), batch, size);
                    break;
                case "publish-async":
                    w = part -> publishAsync(connect(url), src,
                            share(count, threads, part), batch, size);
                    break;
                case "move":
                    w = part -> move(connect(url), src, dst, count, batch, moved);
                    break;
                default:
                    throw new IllegalArgumentException(phase);
            }
            long cpu0 = cpu(), t0 = System.nanoTime();
            runAll(w, threads);
            System.out.printf("{\"seconds\": %.4f, \"client_cpu_s\": %.3f}%n",
                    (System.nanoTime() - t0) / 1e9, (cpu() - cpu0) / 1e9);
        }
    }

    static ActiveMQConnection connect(String url) throws JMSException {
        ActiveMQConnection c = (ActiveMQConnection)
                new ActiveMQConnectionFactory("guest", "guest", url).createConnection();
        c.start();
        return c;
    }

    static long cpu() {
        return ((com.sun.management.OperatingSystemMXBean)
                ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    static int share(int count, int threads, int part) {
        return count / threads + (part < count % threads ? 1 : 0);
    }

    static void runAll(Work w, int threads) throws Exception {
        CountDownLatch latch = new CountDownLatch(threads);
        AtomicReference<Exception> failed = new AtomicReference<>();
        for (int i = 0; i < threads; i++) {
            final int part = i;
            new Thread(() -> {
                try { w.run(part); } catch (Exception e) { failed.set(e); }
                latch.countDown();
            }).start();
        }
        latch.await();
        if (failed.get() != null) throw failed.get();
    }

    static Message body(Session s, int size) throws JMSException {
        BytesMessage m = s.createBytesMessage();
        m.writeBytes(new byte[size]);
        return m;
    }

    /** Persistent sends in transactions of `batch`; each commit returns once stored. */
    static void publishTx(ActiveMQConnection c, String q, int n, int batch, int size)
            throws Exception {
        Session s = c.createSession(true, Session.SESSION_TRANSACTED);
        MessageProducer p = s.createProducer(s.createQueue(q));
        p.setDeliveryMode(DeliveryMode.PERSISTENT);
        for (int i = 1; i <= n; i++) {
            p.send(body(s, size));
            if (i % batch == 0 || i == n) s.commit();
        }
        c.close();
    }

    /** Persistent sends, each answered once stored (a callback); `window` unanswered at most. */
    static void publishAsync(ActiveMQConnection c, String q, int n, int window, int size)
            throws Exception {
        Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE);
        ActiveMQMessageProducer p = (ActiveMQMessageProducer) s.createProducer(s.createQueue(q));
        p.setDeliveryMode(DeliveryMode.PERSISTENT);
        Semaphore room = new Semaphore(window);
        AtomicReference<JMSException> failed = new AtomicReference<>();
        AsyncCallback answered = new AsyncCallback() {
            public void onSuccess() { room.release(); }
            public void onException(JMSException e) { failed.set(e); room.release(); }
        };
        for (int i = 0; i < n; i++) {
            room.acquire();
            p.send(body(s, size), answered);
        }
        room.acquire(window);
        if (failed.get() != null) throw failed.get();
        c.close();
    }

    /** Receive up to `batch`, send each on to dst, commit (the sends and the acks at once);
     *  until `count` are moved by all threads together. */
    static void move(ActiveMQConnection c, String src, String dst, int count, int batch,
                     AtomicInteger moved) throws Exception {
        Session s = c.createSession(true, Session.SESSION_TRANSACTED);
        MessageConsumer in = s.createConsumer(s.createQueue(src));
        MessageProducer out = s.createProducer(s.createQueue(dst));
        out.setDeliveryMode(DeliveryMode.PERSISTENT);
        int pending = 0;
        while (moved.get() < count) {
            Message m = in.receive(pending == 0 ? 200 : 20);
            if (m != null) {
                out.send(m);
                pending++;
            }
            if (pending > 0 && (m == null || pending == batch)) {
                s.commit();
                moved.addAndGet(pending);
                pending = 0;
            }
        }
        c.close();
    }

    /** The queue's size from the broker's statistics plugin; -1 when it does not answer. */
    static long size(ActiveMQConnection c, String q) throws JMSException {
        Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE);
        TemporaryQueue reply = s.createTemporaryQueue();
        MessageConsumer in = s.createConsumer(reply);
        Message ask = s.createMessage();
        ask.setJMSReplyTo(reply);
        s.createProducer(s.createQueue("ActiveMQ.Statistics.Destination." + q)).send(ask);
        MapMessage answer = (MapMessage) in.receive(5000);
        s.close();
        return answer == null ? -1 : answer.getLong("size");
    }
}
