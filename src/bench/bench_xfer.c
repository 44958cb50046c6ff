/* bench_xfer: see bench_xfer.h.  The holder is a real second process
 * (`duplex kv hold --preset-06b`), the reader is this process with its own
 * UCX agent and pool; each transport gets its own holder so that UCX_TLS
 * applies to both ends.  Figures are medians over reps. */
#include "bench/bench_xfer.h"

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
#include "base/dx_err.h"
#include "xfer/xfer_client.h"
#include "xfer/xfer_synth.h"

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
    char *argv[] = {"duplex", "kv",        "hold", "--preset-06b", "--blocks", blocks,
                    "--tls",  (char *)tls, NULL};
    if (!strcmp(tls, "default")) argv[6] = NULL;
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
} xfer_fig;

static int run_pulls(const bench_xfer_config *cfg, xfer_client *c, kv_pool *pool, const holder *h,
                     xfer_fig *fig)
{
    unsigned n = cfg->blocks;
    int32_t *ids = dx_malloc(n * sizeof *ids), *loc = dx_malloc(n * sizeof *loc);
    kv_hash *chain = dx_malloc(n * sizeof *chain);
    unsigned nt = cfg->reps > cfg->lat_reps ? cfg->reps : cfg->lat_reps;
    double *t1 = dx_calloc(nt, sizeof *t1), *t2 = dx_calloc(nt, sizeof *t2);
    if (!ids || !loc || !chain || !t1 || !t2) return DX_ENOMEM;
    for (unsigned i = 0; i < n; i++) ids[i] = loc[i] = (int32_t)i;
    xfer_synth_chain(pool, 1, n, chain);
    xfer_pull_req r = {.host = "127.0.0.1",
                       .port = h->port,
                       .chain = chain,
                       .remote_ids = ids,
                       .local_ids = loc,
                       .n = n,
                       .timeout_s = 60};
    int rc = xfer_token_parse(h->token, &r.token);
    xfer_pull_result res;
    size_t bytes = (size_t)n * kv_pool_block_bytes(pool);
    for (unsigned k = 0; !rc && k <= cfg->reps; k++) { /* k = 0 warms up */
        uint64_t t0 = dx_now_ns();
        rc = xfer_pull(c, &r, &res);
        if (k) t1[k - 1] = (double)(dx_now_ns() - t0) * 1e-6;
        if (k) t2[k - 1] = res.t_read_ms;
        fig->reads = res.n_reads;
    }
    if (!rc) {
        fig->gbps_total = (double)bytes / median(t1, cfg->reps) * 1e-6;
        fig->gbps_read = (double)bytes / median(t2, cfg->reps) * 1e-6;
    }
    r.n = 1;
    for (unsigned k = 0; !rc && k < cfg->lat_reps; k++) {
        r.remote_ids = ids + k % n;
        r.chain = chain + k % n;
        uint64_t t0 = dx_now_ns();
        rc = xfer_pull(c, &r, &res);
        t1[k] = (double)(dx_now_ns() - t0) * 1e-6;
        t2[k] = res.t_read_ms;
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
    return rc ? dx_err_wrap(rc, "%s", res.reason[0] ? res.reason : "pull") : 0;
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
    if (!rc) {
        xfer_hello_init(&hello, "bench", fp, pool, a);
        xfer_client_config cc = {a, pool, &hello};
        rc = xfer_client_create(&cc, &c);
    }
    if (!rc) rc = run_pulls(cfg, c, pool, &h, fig);
    xfer_client_destroy(c);
    kv_pool_destroy(pool);
    xfer_agent_destroy(a);
    holder_stop(&h);
    return rc;
}

int bench_xfer_run(const bench_xfer_config *cfg, FILE *out)
{
    size_t bb = 28u * 2 * 8 * 16 * 128 * 2, bytes = bb * cfg->blocks;
    fprintf(out,
            "bench xfer: %u blocks of %zu bytes (0.6b preset) = %.1f MB per pull, "
            "median of %u pulls; latency: median of %u single-block pulls\n",
            cfg->blocks, bb, (double)bytes / 1e6, cfg->reps, cfg->lat_reps);
    double mc = bench_memcpy(bytes, cfg->reps), sock = bench_socket(bytes, cfg->reps);
    fprintf(out, "%-10s %8.2f GB/s   (in-process memcpy of the same bytes)\n", "memcpy", mc);
    fprintf(out, "%-10s %8.2f GB/s   (plain loopback TCP socket, one stream)\n", "socket", sock);
    char list[256];
    snprintf(list, sizeof list, "%s", cfg->transports);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        xfer_fig f = {0};
        int rc = bench_transport(cfg, t, &f);
        if (rc) {
            fprintf(out, "%-10s failed: %s\n", t, dx_errmsg());
            continue;
        }
        fprintf(out,
                "%-10s %8.2f GB/s read (%u reads), %.2f GB/s end to end (%.0f%% of memcpy, %.0f%% "
                "of socket); 1-block pull %.3f ms (read %.3f ms)\n",
                t, f.gbps_read, f.reads, f.gbps_total, 100 * f.gbps_read / mc,
                100 * f.gbps_read / sock, f.lat_ms, f.lat_read_ms);
    }
    return 0;
}
