// LatchMain runs Apache Curator's LeaderLatch for baton's interop test
// (curator_test.go) and for the request-rate bench (bench/), which compile
// it with javac against Debian's Curator 5.4 jars.
//
//   java LatchMain CONNECT LATCH_PATH ID SESSION_TIMEOUT_MS [quiet]
//
// With "quiet" it does not poll getLeader() (and prints no SEES event), so
// that the only requests it makes are those of the latch and its client.
//
// It prints one event per line, "<microseconds since the epoch> EVENT ARG":
//
//   STARTED ID        the latch has started
//   LEADER ID         LeaderLatchListener.isLeader: this process leads
//   NOTLEADER ID      LeaderLatchListener.notLeader: it stopped leading
//   RESIGNING ID      asked to close while leading: it stops acting now,
//                     before Curator deletes its node
//   CLOSED ID         the latch is closed
//   SEES LEADER_ID    getLeader() changed ("-" when nobody leads)
//   STATE STATE       the client's connection state changed
//   ERROR MESSAGE     getLeader() failed
//
// It reads commands from standard input: "close" closes the latch, "exit"
// (or the end of input) exits. The test kills it with SIGKILL otherwise.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Instant;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.retry.RetryForever;

public class LatchMain {
    private static synchronized void emit(String event, String arg) {
        Instant now = Instant.now();
        long micros = now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
        System.out.println(micros + " " + event + " " + arg);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0];
        String path = args[1];
        String id = args[2];
        int sessionMs = Integer.parseInt(args[3]);
        boolean quiet = args.length > 4 && args[4].equals("quiet");

        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(sessionMs)
                .connectionTimeoutMs(sessionMs)
                .retryPolicy(new RetryForever(100))
                .build();
        client.getConnectionStateListenable().addListener((c, state) -> emit("STATE", state.name()));
        client.start();

        LeaderLatch latch = new LeaderLatch(client, path, id, LeaderLatch.CloseMode.NOTIFY_LEADER);
        latch.addListener(new LeaderLatchListener() {
            @Override
            public void isLeader() {
                emit("LEADER", id);
            }

            @Override
            public void notLeader() {
                emit("NOTLEADER", id);
            }
        });
        latch.start();
        emit("STARTED", id);

        Thread commands = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
                String line;
                while ((line = in.readLine()) != null) {
                    if (line.equals("close")) {
                        // A well-behaved leader stops its work before it lets
                        // go: close() deletes the node before it calls
                        // notLeader.
                        if (latch.hasLeadership()) {
                            emit("RESIGNING", id);
                        }
                        latch.close();
                        emit("CLOSED", id);
                    } else if (line.equals("exit")) {
                        break;
                    }
                }
            } catch (Exception e) {
                emit("ERROR", e.toString().replace('\n', ' '));
            }
            System.exit(0);
        });
        commands.setDaemon(true);
        commands.start();

        if (quiet) {
            while (true) {
                Thread.sleep(Long.MAX_VALUE);
            }
        }
        String seen = null;
        while (true) {
            try {
                if (latch.getState() == LeaderLatch.State.STARTED) {
                    Participant leader = latch.getLeader();
                    String now = leader.getId().isEmpty() ? "-" : leader.getId();
                    if (!now.equals(seen)) {
                        emit("SEES", now);
                        seen = now;
                    }
                }
            } catch (Exception e) {
                emit("ERROR", e.toString().replace('\n', ' '));
            }
            Thread.sleep(50);
        }
    }
}
