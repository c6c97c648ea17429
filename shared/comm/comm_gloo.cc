/* comm_gloo.cc: the Gloo transport of comm.h (libcifar-gloo.so; see comm_gloo.h).
 * The only C++ file of the project: Gloo's API is C++; the C side sees comm_gloo.h.
 *
 * Connection: a TCP device (gloo::transport::tcp) and one pair per peer, each pair
 * with its own listening address; the W-1 addresses of every rank are exchanged
 * through rank 0 (rendezvous_exchange, rendezvous.h: MASTER_ADDR:MASTER_PORT, the
 * job identity and token, strangers refused), then every pair connects. This is
 * what gloo::rendezvous::Context::connectFullMesh does over a key-value store, with
 * the exchange in place of the store (no store to serve, no key layout to follow).
 *
 * Sums in rank order, per chunk of at most GLOO_CHUNK elements, as comm_mpi.c does:
 *   1. reduce-scatter: rank r receives slice r of the chunk from every rank, into
 *      scratch ordered by source rank (unbound buffers, point to point);
 *   2. rank r sums its slice over the sources in order 0..W-1, then divides by W
 *      (slice_sum.h: the operations of the shm and MPI communicators, same bits);
 *   3. all-gather: every rank sends its reduced slice to every other.
 * Gloo's own all-reduce algorithms (ring, halving-doubling, bcube) sum in an order
 * that depends on the algorithm and the rank: not used.
 * Broadcast: the root sends to every rank. Barrier: every rank to rank 0, then
 * rank 0 to every rank.
 *
 * Waits: every send and receive is waited for with Gloo's own timeout (the
 * context's, CIFAR_COMM_TIMEOUT): past it Gloo closes the pairs and throws, and the
 * rank dies naming the collective and the laggard (the progress board). A peer
 * that dies closes its connections: the waits throw at once ("Connection closed by
 * peer"). A stop signal: a watcher thread looks at the stop flag every 50 ms
 * while a wait is in progress and, once comm_stop_due says the grace has passed,
 * aborts the wait (UnboundBuffer::abortWaitRecv/abortWaitSend: the wait returns
 * false, Gloo's state is left alone); the rank then exits 128 + the signal. The
 * pairs' connection (comm_gloo_create, right after the exchange, every peer just
 * seen alive) waits up to the timeout and is not cut short by a stop signal. */
#include "comm/comm_gloo.h"

#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <signal.h>
#include <thread>
#include <time.h>
#include <vector>

#include "comm/slice_sum.h"

namespace {

const size_t GLOO_CHUNK = (size_t)1 << 22; /* elements per round: bounded scratch */

CommGlooHost g_host; /* comm_gloo_set_host's copy; .die NULL until then */

double gloo_now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__attribute__((noreturn, format(printf, 2, 3))) void gloo_die_status(int status, const char *fmt, ...) {
    char message[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (g_host.die) g_host.die(status, message);
    fprintf(stderr, "%s\n", message);
    exit(status);
}

/* A full mesh from the exchanged pair addresses (connectFullMesh without a store). */
class MeshContext : public gloo::Context {
  public:
    MeshContext(int rank, int size) : gloo::Context(rank, size) {}

    void connect(const DistEnv *env, std::shared_ptr<gloo::transport::Device> &dev) {
        auto tctx = dev->createContext(rank, size);
        tctx->setTimeout(getTimeout());
        size_t entry = 0;
        std::vector<char> mine, theirs;
        for (int i = 0; i < size; i++) {
            if (i == rank) continue;
            std::vector<char> bytes = tctx->createPair(i)->address().bytes();
            if (entry == 0) {
                entry = bytes.size();
                mine.assign(entry * (size_t)size, 0);
            }
            if (bytes.size() != entry)
                gloo_die_status(1, "rank %d: Gloo pair addresses of %zu and %zu bytes", rank, entry,
                                bytes.size());
            memcpy(mine.data() + (size_t)i * entry, bytes.data(), entry);
        }
        theirs.assign(mine.size(), 0);
        double timeout_s = (double)getTimeout().count() / 1000.0;
        g_host.exchange(env, mine.data(), theirs.data(), entry, timeout_s);
        for (int i = 0; i < size; i++) {
            if (i == rank) continue;
            const char *p = theirs.data() + (size_t)i * entry;
            tctx->getPair(i)->connect(std::vector<char>(p, p + entry));
        }
        device_ = dev;
        transportContext_ = std::move(tctx);
    }
};

} // namespace

struct CommGloo {
    int rank = 0, world_size = 1;
    double timeout_s = 300;
    const volatile int *stop_signal = nullptr; /* DistEnv's */
    std::shared_ptr<gloo::transport::Device> device;
    std::shared_ptr<MeshContext> context;
    std::vector<unsigned char> scratch; /* (GLOO_CHUNK + W) doubles */
    /* the watcher of stop signals (see the top of the file) */
    std::mutex m;
    std::condition_variable cv;
    std::thread watcher;
    bool closing = false;
    gloo::transport::UnboundBuffer *waiting = nullptr; /* the buffer a wait is on */
    double stop_since = 0;                             /* comm_stop_due's, per wait */
    int aborted_signal = 0;                            /* the signal that ended a wait */

    void watch() {
        std::unique_lock<std::mutex> lock(m);
        while (!closing) {
            cv.wait_for(lock, std::chrono::milliseconds(50));
            if (!waiting || aborted_signal) continue;
            int sig = comm_stop_due(stop_signal, gloo_now(), &stop_since);
            if (!sig) continue;
            aborted_signal = sig;
            waiting->abortWaitRecv();
            waiting->abortWaitSend();
        }
    }
};

namespace {

/* A collective's failure: a timeout (with the laggard), a stop, or Gloo's error. */
__attribute__((noreturn)) void gloo_fail(CommGloo *g, const char *what, double start, const char *reason) {
    char who[512] = "";
    if (g_host.blame) g_host.blame(who, sizeof who);
    if (gloo_now() - start >= g->timeout_s)
        gloo_die_status(1, "rank %d: collective timed out after %g s (Gloo %s)%s\n"
                        "---> HINT: a peer is stopped, stuck or dead; raise CIFAR_COMM_TIMEOUT if it is "
                        "only slow", g->rank, g->timeout_s, what, who);
    gloo_die_status(1, "rank %d: Gloo %s failed: %s%s\n---> HINT: a peer died or the network failed "
                    "(a peer's connection closed); rerun the same command to resume from the latest "
                    "snapshot", g->rank, what, reason, who);
}

__attribute__((noreturn)) void gloo_stopped(CommGloo *g, const char *what) {
    gloo_die_status(128 + g->aborted_signal, "rank %d: stopped by signal %d while waiting for its "
                    "peers (Gloo %s): exiting without a new snapshot (the last one is kept; rerun to "
                    "resume)", g->rank, g->aborted_signal, what);
}

/* Waits for `recvs` receives and `sends` sends of ub, under the watcher's eye. */
void gloo_wait(CommGloo *g, gloo::transport::UnboundBuffer *ub, int recvs, int sends, const char *what) {
    double start = gloo_now();
    {
        std::lock_guard<std::mutex> lock(g->m);
        g->waiting = ub;
        g->stop_since = 0;
    }
    bool done = true;
    try {
        for (int i = 0; i < recvs && done; i++) done = ub->waitRecv(nullptr, gloo::transport::kUnsetTimeout);
        for (int i = 0; i < sends && done; i++) done = ub->waitSend(nullptr, gloo::transport::kUnsetTimeout);
    } catch (const std::exception &e) {
        {
            std::lock_guard<std::mutex> lock(g->m);
            g->waiting = nullptr;
        }
        gloo_fail(g, what, start, e.what());
    }
    std::lock_guard<std::mutex> lock(g->m);
    g->waiting = nullptr;
    if (!done || g->aborted_signal) gloo_stopped(g, what);
}

/* Gloo throws on a closed pair when an operation is posted, too. */
template <typename F> void gloo_post(CommGloo *g, const char *what, F post) {
    double start = gloo_now();
    try {
        post();
    } catch (const std::exception &e) {
        gloo_fail(g, what, start, e.what());
    }
}

typedef void (*SliceReduce)(void *out, const void *in, size_t mine, int world);

/* Steps 1-3 (top of the file) for one chunk of n elements of `elem` bytes. */
void gloo_allreduce_chunk(CommGloo *g, unsigned char *chunk, size_t n, size_t elem, SliceReduce reduce,
                          const char *what) {
    const int w = g->world_size, me = g->rank;
    const size_t lo = slice_lo(n, me, w), mine = slice_lo(n, me + 1, w) - lo;
    auto buf = g->context->createUnboundBuffer(chunk, n * elem);
    auto scratch = g->context->createUnboundBuffer(g->scratch.data(), (size_t)w * mine * elem);
    uint64_t scatter_slot = (uint64_t)g->context->nextSlot(), gather_slot = (uint64_t)g->context->nextSlot();
    int recvs = 0, sends = 0;
    gloo_post(g, what, [&] {
        for (int r = 0; r < w; r++) {
            size_t r_lo = slice_lo(n, r, w), r_n = slice_lo(n, r + 1, w) - r_lo;
            if (r == me) continue;
            if (mine) scratch->recv(r, scatter_slot, (size_t)r * mine * elem, mine * elem), recvs++;
            if (r_n) buf->send(r, scatter_slot, r_lo * elem, r_n * elem), sends++;
        }
    });
    memcpy(g->scratch.data() + (size_t)me * mine * elem, chunk + lo * elem, mine * elem);
    gloo_wait(g, scratch.get(), recvs, 0, what);
    gloo_wait(g, buf.get(), 0, sends, what);
    reduce(chunk + lo * elem, g->scratch.data(), mine, w);
    recvs = sends = 0;
    gloo_post(g, what, [&] {
        for (int r = 0; r < w; r++) {
            size_t r_lo = slice_lo(n, r, w), r_n = slice_lo(n, r + 1, w) - r_lo;
            if (r == me) continue;
            if (r_n) buf->recv(r, gather_slot, r_lo * elem, r_n * elem), recvs++;
            if (mine) buf->send(r, gather_slot, lo * elem, mine * elem), sends++;
        }
    });
    gloo_wait(g, buf.get(), recvs, sends, what);
}

void gloo_allreduce(CommGloo *g, void *data, size_t n, size_t elem, SliceReduce reduce, const char *what) {
    unsigned char *p = (unsigned char *)data;
    for (size_t off = 0; off < n; off += GLOO_CHUNK) {
        size_t len = n - off < GLOO_CHUNK ? n - off : GLOO_CHUNK;
        gloo_allreduce_chunk(g, p + off * elem, len, elem, reduce, what);
    }
}

} // namespace

extern "C" {

int comm_gloo_set_host(const CommGlooHost *host) {
    if (host == nullptr || host->version != COMM_GLOO_HOST_VERSION || host->size != sizeof(CommGlooHost))
        return -1;
    g_host = *host;
    return 0;
}

CommGloo *comm_gloo_create(const DistEnv *env, double timeout_s, const char *iface, const char *address) {
    /* Gloo writes to its sockets without MSG_NOSIGNAL: a peer's death would kill this
     * process with SIGPIPE, silently, instead of failing the wait with a message.
     * cifar-train ignores SIGPIPE already; a host that left the default gets it ignored. */
    struct sigaction pipe_action;
    if (sigaction(SIGPIPE, nullptr, &pipe_action) == 0 && pipe_action.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
    CommGloo *g = new CommGloo();
    g->rank = env->rank;
    g->world_size = env->world_size;
    g->timeout_s = timeout_s;
    g->stop_signal = env->stop_signal;
    g->scratch.assign((GLOO_CHUNK + (size_t)env->world_size) * sizeof(double), 0);
    gloo::transport::tcp::attr attr;
    if (iface && *iface)
        attr.iface = iface;
    else
        attr.hostname = address;
    const char *where = iface && *iface ? iface : address;
    try {
        g->device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception &e) {
        gloo_die_status(1, "rank %d: Gloo cannot listen on %s: %s\n---> HINT: GLOO_SOCKET_IFNAME names "
                        "the network interface to use (ip -brief address lists them)", g->rank, where,
                        e.what());
    }
    g->context = std::make_shared<MeshContext>(env->rank, env->world_size);
    g->context->setTimeout(std::chrono::milliseconds((long long)(timeout_s * 1000)));
    try {
        g->context->connect(env, g->device);
    } catch (const std::exception &e) {
        gloo_die_status(1, "rank %d: Gloo could not connect to its peers (from %s): %s\n---> HINT: every "
                        "rank must reach every other's address: set GLOO_SOCKET_IFNAME to the interface "
                        "of the network between the nodes", g->rank, where, e.what());
    }
    g->watcher = std::thread([g] { g->watch(); });
    /* every pair is up on both sides before the first collective (a peer that leaves
     * right after its own connections then fails the others' collective, not their
     * connection) */
    comm_gloo_barrier(g);
    return g;
}

void comm_gloo_destroy(CommGloo *g) {
    if (g == nullptr) return;
    {
        std::lock_guard<std::mutex> lock(g->m);
        g->closing = true;
    }
    g->cv.notify_all();
    if (g->watcher.joinable()) g->watcher.join();
    g->context.reset();
    g->device.reset();
    delete g;
}

void comm_gloo_allreduce_mean(CommGloo *g, float *buf, size_t n) {
    gloo_allreduce(g, buf, n, sizeof(float), sum_slices_mean_f32, "all-reduce");
}

void comm_gloo_allreduce_sum_f64(CommGloo *g, double *buf, size_t n) {
    gloo_allreduce(g, buf, n, sizeof(double), sum_slices_f64, "all-reduce (f64)");
}

void comm_gloo_broadcast(CommGloo *g, void *buf, size_t bytes, int root) {
    if (bytes == 0) return;
    auto ub = g->context->createUnboundBuffer(buf, bytes);
    uint64_t slot = (uint64_t)g->context->nextSlot();
    int n = 0;
    gloo_post(g, "broadcast", [&] {
        if (g->rank != root) {
            ub->recv(root, slot, 0, bytes);
            return;
        }
        for (int r = 0; r < g->world_size; r++)
            if (r != root) ub->send(r, slot, 0, bytes), n++;
    });
    gloo_wait(g, ub.get(), g->rank == root ? 0 : 1, n, "broadcast");
}

void comm_gloo_barrier(CommGloo *g) {
    unsigned char token = 0;
    auto ub = g->context->createUnboundBuffer(&token, 1);
    uint64_t in_slot = (uint64_t)g->context->nextSlot(), out_slot = (uint64_t)g->context->nextSlot();
    const int w = g->world_size;
    if (g->rank != 0) {
        gloo_post(g, "barrier", [&] { ub->send(0, in_slot, 0, 1), ub->recv(0, out_slot, 0, 1); });
        gloo_wait(g, ub.get(), 1, 1, "barrier");
        return;
    }
    gloo_post(g, "barrier", [&] {
        for (int r = 1; r < w; r++) ub->recv(r, in_slot, 0, 1);
    });
    gloo_wait(g, ub.get(), w - 1, 0, "barrier");
    gloo_post(g, "barrier", [&] {
        for (int r = 1; r < w; r++) ub->send(r, out_slot, 0, 1);
    });
    gloo_wait(g, ub.get(), 0, w - 1, "barrier");
}

} // extern "C"
