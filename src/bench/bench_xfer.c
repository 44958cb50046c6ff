/* bench_xfer: see bench_xfer.h.  The holder is a real second process
 * (`duplex kv hold --preset-06b`), the reader is this process with its own
 * UCX agent and pool; each transport gets its own holder so that UCX_TLS
 * applies to both ends.  Figures are medians over reps. */
#include "bench/bench_xfer.h"

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "xfer/xfer_client.h"
#include "xfer/xfer_synth.h"

/* `duplex kv hold`'s default --fill-seed: the pattern its blocks hold */
#define BENCH_XFER_FILL_SEED 1

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, unsigned n)
{
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double bench_memcpy(size_t bytes, unsigned reps)
{
    uint8_t *a = dx_aligned_alloc(4096, bytes), *b = dx_aligned_alloc(4096, bytes);
    double *t = dx_calloc(reps, sizeof *t), gbps = 0;
    if (a && b && t) {
        memset(a, 1, bytes);
        memset(b, 2, bytes);
        for (unsigned r = 0; r < reps; r++) {
            uint64_t t0 = dx_now_ns();
            memcpy(b, a, bytes);
            t[r] = (double)(dx_now_ns() - t0) * 1e-9;
        }
        gbps = (double)bytes / median(t, reps) * 1e-9;
    }
    dx_aligned_free(a);
    dx_aligned_free(b);
    dx_free(t);
    return gbps;
}

/* A plain loopback TCP socket: a child writes `bytes`, we read them. */
static double bench_socket(size_t bytes, unsigned reps)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &al))
        return 0;
    size_t chunk = 1 << 20;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        char *buf = calloc(1, chunk);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            for (unsigned r = 0; r < reps; r++)
                for (size_t off = 0; off < bytes;) {
                    ssize_t w = write(fd, buf, bytes - off < chunk ? bytes - off : chunk);
                    if (w <= 0) _exit(1);
                    off += (size_t)w;
                }
        _exit(0);
    }
    int fd = accept(ls, NULL, NULL);
    char *buf = dx_malloc(chunk);
    double *t = dx_calloc(reps, sizeof *t), gbps = 0;
    int ok = fd >= 0 && buf && t;
    for (unsigned r = 0; ok && r < reps; r++) {
        uint64_t t0 = dx_now_ns();
        for (size_t got = 0; ok && got < bytes;) {
            ssize_t n = read(fd, buf, bytes - got < chunk ? bytes - got : chunk);
            ok = n > 0;
            got += n > 0 ? (size_t)n : 0;
        }
        t[r] = (double)(dx_now_ns() - t0) * 1e-9;
    }
    if (ok) gbps = (double)bytes / median(t, reps) * 1e-9;
    close(fd);
    close(ls);
    waitpid(pid, NULL, 0);
    dx_free(buf);
    dx_free(t);
    return gbps;
}

typedef struct {
    pid_t pid;
    int port;
    char token[33];
} holder;

static int holder_start(const bench_xfer_config *cfg, const char *tls, holder *h)
{
    int pfd[2];
    if (pipe(pfd)) return dx_errf(DX_EIO, "pipe");
    char blocks[16];
    snprintf(blocks, sizeof blocks, "%u", cfg->blocks);
    char *argv[12] = {"duplex", "kv", "hold", "--preset-06b", "--blocks", blocks};
    int n = 6;
    if (strcmp(tls, "default")) {
        argv[n++] = "--tls";
        argv[n++] = (char *)tls;
    }
    if (cfg->secret_file) {
        argv[n++] = "--kv-secret-file";
        argv[n++] = (char *)cfg->secret_file;
    }
    argv[n] = NULL;
    h->pid = fork();
    if (h->pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        execv(cfg->duplex_bin, argv);
        _exit(127);
    }
    close(pfd[1]);
    char buf[4096];
    size_t len = 0;
    int rc = dx_errf(DX_EIO, "the holder printed no port/token");
    while (len < sizeof buf - 1) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        ssize_t r = poll(&p, 1, 60000) > 0 ? read(pfd[0], buf + len, sizeof buf - 1 - len) : -1;
        if (r <= 0) break;
        len += (size_t)r;
        buf[len] = 0;
        char *j = strstr(buf, "{\"port\":"), *t = j ? strstr(j, "\"token\":\"") : NULL;
        if (t && strlen(t) >= 9 + 32) {
            h->port = atoi(j + 8);
            memcpy(h->token, t + 9, 32);
            h->token[32] = 0;
            rc = 0;
            break;
        }
    }
    close(pfd[0]);
    return rc;
}

static void holder_stop(holder *h)
{
    kill(h->pid, SIGTERM);
    waitpid(h->pid, NULL, 0);
}

typedef struct {
    double gbps_read, gbps_total, lat_ms, lat_read_ms;
    unsigned reads;
    double bytes;                 /* moved by the timed pulls, as the pulls counted them */
    double holder_cpu_ms, pull_ms; /* the holder's CPU time over the timed pulls, their time */
} xfer_fig;

#define CPU_UNREADABLE (-1.0) /* proc_cpu_ms: no thread's time could be read */

/* The holder's CPU time so far (ms): the sum over its threads of
 * /proc/PID/task/TID/schedstat's first field (ns on a CPU; the kernel's
 * scheduler clock, finer than stat's 10 ms ticks); CPU_UNREADABLE if
 * unreadable. */
static double proc_cpu_ms(pid_t pid)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d) return CPU_UNREADABLE;
    double ns = 0;
    int any = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/%d/task/%.20s/schedstat", (int)pid, e->d_name);
        FILE *f = fopen(path, "r");
        unsigned long long run;
        if (f && fscanf(f, "%llu", &run) == 1) {
            ns += (double)run;
            any = 1;
        }
        if (f) fclose(f);
    }
    closedir(d);
    return any ? ns * 1e-6 : CPU_UNREADABLE;
}

/* Zeroes the destination blocks, so that what a pull leaves there is what
 * it read. */
static void clear_blocks(kv_pool *pool, const int32_t *ids, unsigned n)
{
    for (unsigned i = 0; i < n; i++) memset(kv_pool_block_ptr(pool, ids[i]), 0, kv_pool_block_bytes(pool));
}

/* Every block holds the holder's pattern for the block it came from. */
static int check_blocks(const kv_pool *pool, const int32_t *loc, const int32_t *remote, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (!xfer_synth_check(pool, loc[i], BENCH_XFER_FILL_SEED, remote[i]))
            return dx_errf(DX_EMISMATCH, "block %u (remote %d) does not hold what the holder wrote",
                           i, remote[i]);
    return 0;
}

/* One pull that must bring every block: its bytes, or an error. */
static int pull_all(xfer_client *c, const xfer_pull_req *r, xfer_pull_result *res, size_t want)
{
    int rc = xfer_pull(c, r, res);
    if (rc) return dx_err_wrap(rc, "%s", res->reason[0] ? res->reason : "pull");
    if (res->n_pulled != r->n || res->bytes != want)
        return dx_errf(DX_ETRANSPORT, "pulled %u of %zu blocks, %llu of %zu bytes", res->n_pulled,
                       r->n, (unsigned long long)res->bytes, want);
    return 0;
}

static int run_pulls(const bench_xfer_config *cfg, xfer_client *c, kv_pool *pool, const holder *h,
                     xfer_fig *fig)
{
    unsigned n = cfg->blocks;
    int32_t *ids = dx_malloc(n * sizeof *ids), *loc = dx_malloc(n * sizeof *loc);
    kv_hash *chain = dx_malloc(n * sizeof *chain);
    unsigned nt = cfg->reps > cfg->lat_reps ? cfg->reps : cfg->lat_reps;
    double *t1 = dx_calloc(nt, sizeof *t1), *t2 = dx_calloc(nt, sizeof *t2);
    if (!ids || !loc || !chain || !t1 || !t2)
        return dx_errf(DX_ENOMEM, "bench xfer: tables for %u blocks", n);
    /* the holder filled a fresh pool: its blocks are 0..n-1 in chain order */
    for (unsigned i = 0; i < n; i++) ids[i] = loc[i] = (int32_t)i;
    xfer_synth_chain(pool, BENCH_XFER_FILL_SEED, n, chain);
    xfer_pull_req r = {.host = "127.0.0.1",
                       .port = h->port,
                       .chain = chain,
                       .remote_ids = ids,
                       .local_ids = loc,
                       .n = n,
                       .timeout_s = 60};
    int rc = xfer_token_parse(h->token, &r.token);
    xfer_pull_result res;
    size_t bb = kv_pool_block_bytes(pool);
    double cpu0 = 0;
    for (unsigned k = 0; !rc && k <= cfg->reps; k++) { /* k = 0 warms up */
        int check = k == 0 || k == cfg->reps;          /* the first and last pulls are verified */
        if (check) clear_blocks(pool, loc, n);
        if (k == 1) cpu0 = proc_cpu_ms(h->pid);
        uint64_t t0 = dx_now_ns();
        rc = pull_all(c, &r, &res, (size_t)n * bb);
        double ms = (double)(dx_now_ns() - t0) * 1e-6;
        if (!rc && check) rc = check_blocks(pool, loc, ids, n);
        if (rc || !k) continue;
        t1[k - 1] = ms;
        t2[k - 1] = res.t_read_ms;
        fig->reads = res.n_reads;
        fig->bytes += (double)res.bytes;
        fig->pull_ms += ms;
    }
    if (!rc) {
        double cpu1 = proc_cpu_ms(h->pid);
        fig->holder_cpu_ms = cpu0 >= 0 && cpu1 >= 0 ? cpu1 - cpu0 : CPU_UNREADABLE;
        fig->gbps_total = fig->bytes / cfg->reps / median(t1, cfg->reps) * 1e-6;
        fig->gbps_read = fig->bytes / cfg->reps / median(t2, cfg->reps) * 1e-6;
    }
    r.n = 1;
    for (unsigned k = 0; !rc && k < cfg->lat_reps; k++) {
        r.remote_ids = ids + k % n;
        r.local_ids = loc + k % n;
        r.chain = chain + k % n;
        clear_blocks(pool, r.local_ids, 1);
        uint64_t t0 = dx_now_ns();
        rc = pull_all(c, &r, &res, bb);
        t1[k] = (double)(dx_now_ns() - t0) * 1e-6;
        t2[k] = res.t_read_ms;
        if (!rc) rc = check_blocks(pool, r.local_ids, r.remote_ids, 1);
    }
    if (!rc) {
        fig->lat_ms = median(t1, cfg->lat_reps);
        fig->lat_read_ms = median(t2, cfg->lat_reps);
    }
    dx_free(ids);
    dx_free(loc);
    dx_free(chain);
    dx_free(t1);
    dx_free(t2);
    return rc;
}

static int bench_transport(const bench_xfer_config *cfg, const char *tls, xfer_fig *fig)
{
    holder h;
    int rc = holder_start(cfg, tls, &h);
    if (rc) return rc;
    xfer_agent *a = NULL;
    kv_pool *pool = NULL;
    xfer_client *c = NULL;
    kv_pool_config pc;
    uint8_t fp[16];
    xfer_agent_config ac = {.tls = strcmp(tls, "default") ? tls : NULL, .no_progress_thread = 1};
    rc = xfer_agent_create(&ac, &a);
    if (!rc) {
        xfer_synth_layout_06b(cfg->blocks, 1, &pc, fp);
        pc.alloc = xfer_agent_alloc;
        pc.release = xfer_agent_release;
        pc.alloc_user = a;
        rc = kv_pool_create(&pc, &pool);
    }
    kvport_hello hello;
    kvport_secret *secret = NULL;
    if (!rc && cfg->secret_file) rc = kvport_secret_load(cfg->secret_file, &secret);
    if (!rc) {
        xfer_hello_init(&hello, "bench", fp, pool, a);
        xfer_client_config cc = {.agent = a, .pool = pool, .hello = &hello, .secret = secret};
        rc = xfer_client_create(&cc, &c);
    }
    if (!rc) rc = run_pulls(cfg, c, pool, &h, fig);
    xfer_client_destroy(c);
    kvport_secret_destroy(secret);
    kv_pool_destroy(pool);
    xfer_agent_destroy(a);
    holder_stop(&h);
    return rc;
}

int bench_xfer_run(const bench_xfer_config *cfg, FILE *out)
{
    kv_pool_config pc; /* the layout both ends use: the block size comes from it */
    uint8_t fp[16];
    xfer_synth_layout_06b(cfg->blocks, 1, &pc, fp);
    size_t bb;
    int rc = kv_pool_config_block_bytes(&pc, &bb);
    if (rc) return rc;
    size_t bytes = bb * cfg->blocks;
    fprintf(out,
            "bench xfer: %u blocks of %zu bytes (the 0.6b preset's layout: %u layers x K,V x %u "
            "KV heads x %u tokens x %u dims, %s) = %.1f MB per pull, median of %u pulls; "
            "latency: median of %u single-block pulls.  Every byte counted is one a pull "
            "reported moved; the first and last pulls are checked against the holder's "
            "pattern.\n",
            cfg->blocks, bb, pc.n_layer, pc.n_kv_head, pc.block_size, pc.head_dim, dx_dtype_name(pc.dtype),
            (double)bytes / 1e6, cfg->reps, cfg->lat_reps);
    double mc = bench_memcpy(bytes, cfg->reps), sock = bench_socket(bytes, cfg->reps);
    fprintf(out, "%-10s %8.2f GB/s   (in-process memcpy of the same bytes)\n", "memcpy", mc);
    fprintf(out, "%-10s %8.2f GB/s   (plain loopback TCP socket, one stream)\n", "socket", sock);
    char list[256];
    snprintf(list, sizeof list, "%s", cfg->transports);
    int failed = 0;
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        xfer_fig f = {0};
        int rc = bench_transport(cfg, t, &f);
        if (rc) {
            fprintf(out, "%-10s failed: %s\n", t, dx_errmsg());
            failed = 1;
            continue;
        }
        fprintf(out,
                "%-10s %8.2f GB/s read (%u reads), %.2f GB/s end to end (%.0f%% of memcpy, %.0f%% "
                "of socket); 1-block pull %.3f ms (read %.3f ms); data checked\n",
                t, f.gbps_read, f.reads, f.gbps_total, 100 * f.gbps_read / mc,
                100 * f.gbps_read / sock, f.lat_ms, f.lat_read_ms);
        if (f.holder_cpu_ms >= 0)
            fprintf(out,
                    "%-10s holder CPU over %u timed pulls of %.1f MB in %.1f ms: %.3f ms "
                    "(its threads' /proc schedstat)\n",
                    "", cfg->reps, f.bytes / 1e6, f.pull_ms, f.holder_cpu_ms);
    }
    return failed ? dx_errf(DX_ETRANSPORT, "a transport failed (see above)") : 0;
}
