import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

import org.redisson.Redisson;
import org.redisson.RedissonFencedLock;
import org.redisson.api.RCountDownLatch;
import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RSemaphore;
import org.redisson.api.RedissonClient;
import org.redisson.config.ClusterServersConfig;
import org.redisson.config.Config;
import org.redisson.config.ReadMode;
import org.redisson.config.SentinelServersConfig;
import org.redisson.config.ShardedSubscriptionMode;
import org.redisson.config.SubscriptionMode;

/**
 * A Redisson client driven over stdin/stdout by fairlock's interop tests
 * (tests/redisson_interop*.rs).
 *
 * <p>One JVM acts as many lock holders: every lock call names the holder ("thread") id explicitly
 * and uses Redisson's {@code *Async(..., threadId)} API, so a blocking lock of holder 5 and an
 * unlock of holder 7 can be in flight at once. Each request line starts with a request id that
 * its reply repeats; a reply may come long after the request (a lock that waits).
 *
 * <pre>
 * arguments:  --single URL | --cluster URL,URL,... | --sentinel MASTER URL,URL,...
 *             [--watchdog MS] [--sharded auto|on|off] [--subscription master|slave]
 * stdout:     READY &lt;client uuid&gt;            once Redisson is connected
 * requests:   ID lock KIND NAME HOLDER LEASE_MS             (LEASE_MS -1: watchdog)
 *             ID trylock KIND NAME HOLDER WAIT_MS LEASE_MS
 *             ID unlock KIND NAME HOLDER
 *             ID force KIND NAME
 *             ID held KIND NAME HOLDER
 *             ID ttl KIND NAME
 *             ID sem trysetpermits|acquire|release|add NAME N     (RSemaphore)
 *             ID sem tryacquire NAME N WAIT_MS
 *             ID sem available NAME
 *             ID pes trysetpermits NAME N                        (RPermitExpirableSemaphore)
 *             ID pes acquire NAME LEASE_MS                       (LEASE_MS -1: no lease) -> id
 *             ID pes tryacquire NAME WAIT_MS LEASE_MS             -> id | null
 *             ID pes release|tryrelease NAME ID
 *             ID pes available NAME
 *             ID latch trysetcount NAME N                        (RCountDownLatch)
 *             ID latch countdown|count|delete NAME
 *             ID latch await NAME WAIT_MS                        (WAIT_MS -1: no bound)
 *             ID multi lock KIND HOLDER LEASE_MS NAME...          (getMultiLock, caller's order)
 *             ID multi trylock KIND HOLDER WAIT_MS LEASE_MS NAME...
 *             ID multi unlock KIND HOLDER NAME...
 *             ID quit
 * replies:    ID ok [VALUE]      lock: the fencing token for KIND fenced, else nothing;
 *                                trylock: true|false [token]; force, held: true|false; ttl: ms;
 *                                sem, latch: the value Redisson returns (true|false, a count)
 *             ID err EXCEPTION-CLASS MESSAGE
 * KIND:       fair (getFairLock), plain (getLock), fenced (getFencedLock),
 *             read, write (getReadWriteLock(NAME).readLock(), .writeLock())
 * </pre>
 */
public final class RedissonPeer {
    private final RedissonClient redisson;
    private final Map<String, RLock> locks = new ConcurrentHashMap<>();

    private RedissonPeer(RedissonClient redisson) {
        this.redisson = redisson;
    }

    public static void main(String[] args) throws Exception {
        RedissonClient redisson = Redisson.create(config(args));
        RedissonPeer peer = new RedissonPeer(redisson);
        emit("READY " + redisson.getId());
        BufferedReader in =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            String[] words = line.trim().split("\\s+");
            if (words.length >= 2 && words[1].equals("quit")) {
                emit(words[0] + " ok");
                break;
            }
            try {
                peer.handle(words);
            } catch (RuntimeException e) {
                failed(words[0], e);
            }
        }
        // End of input (the test is done or died): leave at once; Redis keeps whatever we hold
        // until its lease runs out, as for any JVM that goes away.
        System.exit(0);
    }

    private static Config config(String[] args) {
        String topology = null;
        String master = null;
        String[] urls = null;
        long watchdog = 30_000;
        ShardedSubscriptionMode sharded = ShardedSubscriptionMode.AUTO;
        SubscriptionMode subscription = null;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--single":
                case "--cluster":
                    topology = args[i];
                    urls = args[++i].split(",");
                    break;
                case "--sentinel":
                    topology = args[i];
                    master = args[++i];
                    urls = args[++i].split(",");
                    break;
                case "--watchdog":
                    watchdog = Long.parseLong(args[++i]);
                    break;
                case "--sharded":
                    sharded = ShardedSubscriptionMode.valueOf(args[++i].toUpperCase());
                    break;
                case "--subscription":
                    subscription = SubscriptionMode.valueOf(args[++i].toUpperCase());
                    break;
                default:
                    throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        if (topology == null) {
            throw new IllegalArgumentException("one of --single, --cluster, --sentinel is required");
        }
        Config config = new Config().setLockWatchdogTimeout(watchdog);
        // Small connection pools (the tests start several JVMs) and reads from the master (so an
        // inspection never sees a replica lagging behind): neither touches the lock scripts,
        // which always run on the master.
        switch (topology) {
            case "--single":
                config.useSingleServer()
                        .setAddress(urls[0])
                        .setConnectionMinimumIdleSize(2)
                        .setSubscriptionConnectionMinimumIdleSize(1);
                break;
            case "--cluster":
                ClusterServersConfig cluster = config.useClusterServers()
                        .addNodeAddress(urls)
                        .setShardedSubscriptionMode(sharded)
                        .setMasterConnectionMinimumIdleSize(2)
                        .setSlaveConnectionMinimumIdleSize(1)
                        .setSubscriptionConnectionMinimumIdleSize(1)
                        .setReadMode(ReadMode.MASTER);
                if (subscription != null) {
                    cluster.setSubscriptionMode(subscription);
                }
                break;
            default:
                SentinelServersConfig sentinel = config.useSentinelServers()
                        .setMasterName(master)
                        .addSentinelAddress(urls)
                        .setMasterConnectionMinimumIdleSize(2)
                        .setSlaveConnectionMinimumIdleSize(1)
                        .setSubscriptionConnectionMinimumIdleSize(1)
                        .setReadMode(ReadMode.MASTER);
                if (subscription != null) {
                    sentinel.setSubscriptionMode(subscription);
                }
                break;
        }
        return config;
    }

    private void handle(String[] w) {
        String id = w[0];
        String op = w[1];
        switch (op) {
            case "lock": {
                RLock lock = lock(w[2], w[3]);
                long holder = Long.parseLong(w[4]);
                long lease = Long.parseLong(w[5]);
                if (lock instanceof RedissonFencedLock) {
                    // The holder-id form is public on the class, not on the RFencedLock interface.
                    RedissonFencedLock fenced = (RedissonFencedLock) lock;
                    answer(id,
                            fenced.tryLockAndGetTokenAsync(-1, lease, TimeUnit.MILLISECONDS, holder),
                            token -> String.valueOf(token));
                } else {
                    answer(id, lock.lockAsync(lease, TimeUnit.MILLISECONDS, holder), v -> "");
                }
                break;
            }
            case "trylock": {
                RLock lock = lock(w[2], w[3]);
                long holder = Long.parseLong(w[4]);
                long wait = Long.parseLong(w[5]);
                long lease = Long.parseLong(w[6]);
                if (lock instanceof RedissonFencedLock) {
                    RedissonFencedLock fenced = (RedissonFencedLock) lock;
                    answer(id,
                            fenced.tryLockAndGetTokenAsync(wait, lease, TimeUnit.MILLISECONDS, holder),
                            token -> token == null ? "false" : "true " + token);
                } else {
                    answer(id, lock.tryLockAsync(wait, lease, TimeUnit.MILLISECONDS, holder),
                            String::valueOf);
                }
                break;
            }
            case "unlock":
                answer(id, lock(w[2], w[3]).unlockAsync(Long.parseLong(w[4])), v -> "");
                break;
            case "force":
                answer(id, lock(w[2], w[3]).forceUnlockAsync(), String::valueOf);
                break;
            case "held":
                answer(id, lock(w[2], w[3]).isHeldByThreadAsync(Long.parseLong(w[4])),
                        String::valueOf);
                break;
            case "ttl":
                answer(id, lock(w[2], w[3]).remainTimeToLiveAsync(), String::valueOf);
                break;
            case "sem":
                semaphore(id, w[2], redisson.getSemaphore(w[3]), w);
                break;
            case "latch":
                latch(id, w[2], redisson.getCountDownLatch(w[3]), w);
                break;
            case "multi":
                multi(id, w);
                break;
            case "pes":
                expirable(id, w[2], redisson.getPermitExpirableSemaphore(w[3]), w);
                break;
            default:
                throw new IllegalArgumentException("unknown request " + op);
        }
    }

    private static void semaphore(String id, String op, RSemaphore sem, String[] w) {
        switch (op) {
            case "trysetpermits":
                answer(id, sem.trySetPermitsAsync(Integer.parseInt(w[4])), String::valueOf);
                break;
            case "acquire":
                answer(id, sem.acquireAsync(Integer.parseInt(w[4])), v -> "");
                break;
            case "tryacquire":
                answer(id, sem.tryAcquireAsync(Integer.parseInt(w[4]),
                        java.time.Duration.ofMillis(Long.parseLong(w[5]))), String::valueOf);
                break;
            case "release":
                answer(id, sem.releaseAsync(Integer.parseInt(w[4])), v -> "");
                break;
            case "add":
                answer(id, sem.addPermitsAsync(Integer.parseInt(w[4])), v -> "");
                break;
            case "available":
                answer(id, sem.availablePermitsAsync(), String::valueOf);
                break;
            default:
                throw new IllegalArgumentException("unknown semaphore request " + op);
        }
    }

    private void multi(String id, String[] w) {
        String op = w[2];
        String kind = w[3];
        long holder = Long.parseLong(w[4]);
        int first = op.equals("trylock") ? 7 : op.equals("lock") ? 6 : 5;
        RLock[] members = new RLock[w.length - first];
        for (int i = first; i < w.length; i++) {
            members[i - first] = lock(kind, w[i]);
        }
        RLock multi = redisson.getMultiLock(members);
        switch (op) {
            case "lock":
                answer(id, multi.lockAsync(Long.parseLong(w[5]), TimeUnit.MILLISECONDS, holder),
                        v -> "");
                break;
            case "trylock":
                answer(id, multi.tryLockAsync(Long.parseLong(w[5]), Long.parseLong(w[6]),
                        TimeUnit.MILLISECONDS, holder), String::valueOf);
                break;
            case "unlock":
                answer(id, multi.unlockAsync(holder), v -> "");
                break;
            default:
                throw new IllegalArgumentException("unknown multi-lock request " + op);
        }
    }

    private static void expirable(
            String id, String op, RPermitExpirableSemaphore sem, String[] w) {
        switch (op) {
            case "trysetpermits":
                answer(id, sem.trySetPermitsAsync(Integer.parseInt(w[4])), String::valueOf);
                break;
            case "acquire": {
                long lease = Long.parseLong(w[4]);
                if (lease < 0) {
                    answer(id, sem.acquireAsync(), String::valueOf);
                } else {
                    answer(id, sem.acquireAsync(lease, TimeUnit.MILLISECONDS), String::valueOf);
                }
                break;
            }
            case "tryacquire":
                answer(id, sem.tryAcquireAsync(Long.parseLong(w[4]), Long.parseLong(w[5]),
                        TimeUnit.MILLISECONDS), String::valueOf);
                break;
            case "release":
                answer(id, sem.releaseAsync(w[4]), v -> "");
                break;
            case "tryrelease":
                answer(id, sem.tryReleaseAsync(w[4]), String::valueOf);
                break;
            case "available":
                answer(id, sem.availablePermitsAsync(), String::valueOf);
                break;
            default:
                throw new IllegalArgumentException("unknown expirable semaphore request " + op);
        }
    }

    private static void latch(String id, String op, RCountDownLatch latch, String[] w) {
        switch (op) {
            case "trysetcount":
                answer(id, latch.trySetCountAsync(Long.parseLong(w[4])), String::valueOf);
                break;
            case "countdown":
                answer(id, latch.countDownAsync(), v -> "");
                break;
            case "count":
                answer(id, latch.getCountAsync(), String::valueOf);
                break;
            case "delete":
                answer(id, latch.deleteAsync(), String::valueOf);
                break;
            case "await": {
                long wait = Long.parseLong(w[4]);
                if (wait < 0) {
                    answer(id, latch.awaitAsync(), v -> "true");
                } else {
                    answer(id, latch.awaitAsync(wait, TimeUnit.MILLISECONDS), String::valueOf);
                }
                break;
            }
            default:
                throw new IllegalArgumentException("unknown latch request " + op);
        }
    }

    private RLock lock(String kind, String name) {
        return locks.computeIfAbsent(kind + " " + name, k -> {
            switch (kind) {
                case "fair":
                    return redisson.getFairLock(name);
                case "plain":
                    return redisson.getLock(name);
                case "fenced":
                    return redisson.getFencedLock(name);
                case "read":
                    return redisson.getReadWriteLock(name).readLock();
                case "write":
                    return redisson.getReadWriteLock(name).writeLock();
                default:
                    throw new IllegalArgumentException("unknown lock kind " + kind);
            }
        });
    }

    private static <T> void answer(
            String id, CompletionStage<T> future, Function<T, String> render) {
        future.whenComplete((value, error) -> {
            if (error != null) {
                failed(id, error);
            } else {
                String text = render.apply(value);
                emit(text.isEmpty() ? id + " ok" : id + " ok " + text);
            }
        });
    }

    private static void failed(String id, Throwable error) {
        Throwable cause = error;
        while (cause.getCause() != null
                && (cause instanceof java.util.concurrent.CompletionException
                        || cause instanceof java.util.concurrent.ExecutionException)) {
            cause = cause.getCause();
        }
        String message = String.valueOf(cause.getMessage()).replaceAll("\\s+", " ");
        emit(id + " err " + cause.getClass().getSimpleName() + " " + message);
    }

    private static void emit(String line) {
        synchronized (System.out) {
            System.out.println(line);
            System.out.flush();
        }
    }
}
