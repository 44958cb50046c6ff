/* router_launch: `duplex up` (see .h).
 *
 * Children are started with fork/exec rather than uv_spawn because each
 * needs two things between the two: its own process group and
 * PR_SET_PDEATHSIG.  They are reaped from a uv_signal_t on SIGCHLD.  Each
 * child's stdout and stderr share one pipe, read on the loop line by line:
 * lines are relayed with the child's name and the start-up lines parsed
 * for the ports.
 *
 * Phases: NODES (waiting for every node's start-up line) → ROUTER (its
 * start-up line) → HEALTH (polling the router's /health with router_up) →
 * RUNNING → STOPPING (router first, then nodes) → done. */
#include "up/router_launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_log.h"
#include "up/router_rundir.h"
#include "router/router_up.h"
#include "xfer/kvport_auth.h"

enum phase { PH_NODES, PH_ROUTER, PH_HEALTH, PH_RUNNING, PH_STOPPING };
enum kid_role { KID_PREFILL, KID_DECODE, KID_ROUTER };

typedef struct launch launch;

typedef struct {
    launch *L;
    char name[24];
    enum kid_role role;
    pid_t pid;
    int exited, status;
    uv_pipe_t out;
    int out_open;
    char line[4096];
    size_t line_len;
    int http_port, kv_port, ready;
} lkid;

struct launch {
    uv_loop_t loop;
    router_launch_config cfg;
    lkid *kids; /* nodes, then the router */
    size_t n_kids, n_nodes;
    uv_signal_t sig_int, sig_term, sig_chld;
    uv_timer_t timer; /* start-up limit, then the stop limit */
    uv_timer_t poll;  /* the router's /health, until it answers 200 */
    router_up *up;
    router_up_req *check;
    router_rundir run; /* the cluster's keys */
    enum phase phase;
    int exit_code, signals;
};

const char *router_launch_mode_name(enum router_launch_mode m)
{
    return m == LAUNCH_COLOCATED        ? "colocated"
           : m == LAUNCH_UNIDIRECTIONAL ? "unidirectional"
                                        : "bidirectional";
}

int router_launch_parse_mode(const char *s, enum router_launch_mode *out)
{
    for (int m = LAUNCH_BIDIRECTIONAL; m <= LAUNCH_COLOCATED; m++)
        if (!strcmp(s, router_launch_mode_name((enum router_launch_mode)m))) {
            *out = (enum router_launch_mode)m;
            return 0;
        }
    return dx_errf(DX_EINVAL, "'%s' is not a mode (bidirectional|unidirectional|colocated)", s);
}

/* ---- command lines ------------------------------------------------------------ */

static void arg(router_launch_argv *a, const char *s)
{
    DX_ASSERT(a->argc + 1 < (int)DX_ARRAY_LEN(a->argv));
    a->argv[a->argc++] = (char *)s;
    a->argv[a->argc] = NULL;
}

static void arg_num(router_launch_argv *a, long v)
{
    DX_ASSERT(a->n_owned < (int)DX_ARRAY_LEN(a->owned));
    char *s = a->owned[a->n_owned++];
    snprintf(s, sizeof a->owned[0], "%ld", v);
    arg(a, s);
}

/* Every child: the cluster's internal key and the API keys, as files. */
static void arg_keys(const router_launch_config *c, router_launch_argv *a)
{
    if (c->internal_key_file) {
        arg(a, "--internal-key-file");
        arg(a, c->internal_key_file);
    }
    if (c->api_key_file) {
        arg(a, "--api-key-file");
        arg(a, c->api_key_file);
    }
}

void router_launch_node_argv(const router_launch_config *c, int prefill, router_launch_argv *a)
{
    memset(a, 0, sizeof *a);
    arg(a, c->exe);
    arg(a, "serve");
    arg(a, "--model");
    arg(a, c->model);
    arg(a, "--role");
    arg(a, c->mode == LAUNCH_COLOCATED ? "both" : prefill ? "prefill" : "decode");
    arg(a, "--host");
    arg(a, "127.0.0.1");
    arg(a, "--port");
    arg(a, "0");
    /* the router reaches its nodes from loopback: no per-peer cap for it,
     * and the connections kept in reserve */
    arg(a, "--trusted-peer");
    arg(a, "127.0.0.1");
    if (c->mode != LAUNCH_COLOCATED) { /* the KV port on a free port */
        arg(a, "--kv-port");
        arg(a, "0");
        if (c->kv_secret_file) {
            arg(a, "--kv-secret-file");
            arg(a, c->kv_secret_file);
            arg(a, "--kv-peers");
            arg(a, "127.0.0.1");
        }
    }
    if (c->mode == LAUNCH_BIDIRECTIONAL) arg(a, "--bidirectional-kv-xfer");
    if (prefill && c->prefill_no_prefix_caching) arg(a, "--no-enable-prefix-caching");
    if (c->threads_per_node > 0) {
        arg(a, "--threads");
        arg_num(a, c->threads_per_node);
    }
    if (c->kv_cache_mb > 0) {
        arg(a, "--kv-cache-mb");
        arg_num(a, c->kv_cache_mb);
    }
    if (c->kv_dtype) {
        arg(a, "--kv-dtype");
        arg(a, c->kv_dtype);
    }
    if (c->debug_children) {
        arg(a, "--log-level");
        arg(a, "debug");
    }
    arg_keys(c, a);
}

static int arg_heap(router_launch_argv *a, const char *s)
{
    DX_ASSERT(a->n_heap < (int)DX_ARRAY_LEN(a->heap));
    char *h = dx_strdup(s);
    if (!h) return dx_errf(DX_ENOMEM, "out of memory");
    a->heap[a->n_heap++] = h;
    arg(a, h);
    return 0;
}

int router_launch_router_argv(const router_launch_config *c, const char *prefill_urls,
                              const char *decode_urls, router_launch_argv *a)
{
    memset(a, 0, sizeof *a);
    arg(a, c->exe);
    arg(a, "router");
    int rc = 0;
    if (c->mode != LAUNCH_COLOCATED && prefill_urls && *prefill_urls) {
        arg(a, "--prefill");
        rc = arg_heap(a, prefill_urls);
    }
    arg(a, "--decode");
    if (!rc) rc = arg_heap(a, decode_urls);
    arg(a, "--host");
    arg(a, "127.0.0.1");
    arg(a, "--port");
    arg_num(a, c->port);
    arg(a, "--tokenizer"); /* exact prompt lengths for the local-prefill choice */
    arg(a, c->model);
    if (c->mode != LAUNCH_COLOCATED) {
        arg(a, "--mode");
        arg(a, router_launch_mode_name(c->mode));
    }
    if (c->has_local_prefill) {
        arg(a, "--local-prefill-max-tokens");
        arg_num(a, c->local_prefill_max_tokens);
    }
    if (c->debug_children) {
        arg(a, "--log-level");
        arg(a, "debug");
    }
    arg_keys(c, a);
    if (rc) router_launch_argv_free(a);
    return rc;
}

void router_launch_argv_free(router_launch_argv *a)
{
    for (int i = 0; i < a->n_heap; i++) dx_free(a->heap[i]);
    a->n_heap = 0;
}

/* ---- children ------------------------------------------------------------------- */

static void describe_exit(int st, char *out, size_t cap)
{
    if (WIFEXITED(st))
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(out, cap, "ended (wait status %d)", st);
}

/* Runs in the child between fork and exec: async-signal-safe calls only. */
static void child_exec(char *const argv[], int out_fd, pid_t parent)
{
    setpgid(0, 0); /* a terminal's Ctrl-C is the launcher's to handle */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1); /* the launcher died before prctl */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    execv(argv[0], argv);
    _exit(127);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static char rbuf[65536]; /* the loop reads one pipe at a time */
    *buf = uv_buf_init(rbuf, sizeof rbuf);
}

static void kid_line(lkid *k, const char *line);
static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

static void on_pipe_closed(uv_handle_t *h) {}

static int kid_spawn(launch *L, lkid *k, char *const argv[])
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) return dx_errf(DX_EIO, "pipe: %s", strerror(errno));
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return dx_errf(DX_EIO, "fork: %s", strerror(errno));
    }
    if (pid == 0) child_exec(argv, fds[1], parent);
    close(fds[1]);
    k->L = L;
    k->pid = pid;
    k->status = -1;
    uv_pipe_init(&L->loop, &k->out, 0);
    k->out.data = k;
    uv_pipe_open(&k->out, fds[0]);
    uv_read_start((uv_stream_t *)&k->out, on_alloc, on_read);
    k->out_open = 1;
    return 0;
}

static void kid_close_pipe(lkid *k)
{
    if (!k->out_open) return;
    k->out_open = 0;
    uv_close((uv_handle_t *)&k->out, on_pipe_closed);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    lkid *k = s->data;
    if (n < 0) { /* EOF: the child (and anything it left running) closed it */
        if (k->line_len) {
            k->line[k->line_len] = 0;
            kid_line(k, k->line);
            k->line_len = 0;
        }
        kid_close_pipe(k);
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        char c = buf->base[i];
        if (c != '\n' && k->line_len + 1 < sizeof k->line) {
            k->line[k->line_len++] = c;
            continue;
        }
        k->line[k->line_len] = 0; /* a line over the buffer goes out in pieces */
        kid_line(k, k->line);
        k->line_len = 0;
        if (c != '\n') k->line[k->line_len++] = c;
    }
}

static void signal_kids(launch *L, int sig, int routers, int nodes)
{
    for (size_t i = 0; i < L->n_kids; i++) {
        lkid *k = &L->kids[i];
        int is_router = k->role == KID_ROUTER;
        if (k->pid > 0 && !k->exited && (is_router ? routers : nodes)) kill(k->pid, sig);
    }
}

/* ---- phases ------------------------------------------------------------------------ */

static void finish(launch *L);

static lkid *router_kid(launch *L)
{
    return L->n_kids > L->n_nodes ? &L->kids[L->n_nodes] : NULL;
}

static void on_stop_timeout(uv_timer_t *t)
{
    launch *L = t->data;
    fprintf(stderr, "duplex up: children still running after %.0f s: killing them\n",
            L->cfg.stop_timeout_s);
    signal_kids(L, SIGKILL, 1, 1);
}

/* Router first: it drains requests that need the nodes. */
static void stop_all(launch *L, int exit_code)
{
    if (exit_code) L->exit_code = exit_code;
    if (L->phase == PH_STOPPING) return;
    L->phase = PH_STOPPING;
    router_up_cancel(L->check);
    L->check = NULL;
    uv_timer_stop(&L->poll);
    lkid *r = router_kid(L);
    if (r && !r->exited)
        kill(r->pid, SIGTERM);
    else
        signal_kids(L, SIGTERM, 0, 1);
    uv_timer_stop(&L->timer);
    uv_timer_start(&L->timer, on_stop_timeout, (uint64_t)(L->cfg.stop_timeout_s * 1e3), 0);
    finish(L);
}

static int all_exited(const launch *L)
{
    for (size_t i = 0; i < L->n_kids; i++)
        if (!L->kids[i].exited) return 0;
    return 1;
}

static void on_handle_closed(uv_handle_t *h) {}

/* Everything has exited: close the handles so the loop ends. */
static void finish(launch *L)
{
    if (L->phase != PH_STOPPING || !all_exited(L)) return;
    uv_timer_stop(&L->timer);
    uv_close((uv_handle_t *)&L->timer, on_handle_closed);
    uv_close((uv_handle_t *)&L->poll, on_handle_closed);
    uv_close((uv_handle_t *)&L->sig_int, on_handle_closed);
    uv_close((uv_handle_t *)&L->sig_term, on_handle_closed);
    uv_close((uv_handle_t *)&L->sig_chld, on_handle_closed);
    router_up_destroy(L->up);
    L->up = NULL;
}

static void print_summary(launch *L)
{
    FILE *o = L->cfg.out;
    for (size_t i = 0; i < L->n_kids; i++) {
        lkid *k = &L->kids[i];
        if (k->role == KID_ROUTER)
            fprintf(o, "duplex up: %-9s pid %-7d http://127.0.0.1:%d  mode %s\n", k->name,
                    (int)k->pid, k->http_port, router_launch_mode_name(L->cfg.mode));
        else if (k->kv_port > 0)
            fprintf(o, "duplex up: %-9s pid %-7d http://127.0.0.1:%d  kv port %d\n", k->name,
                    (int)k->pid, k->http_port, k->kv_port);
        else
            fprintf(o, "duplex up: %-9s pid %-7d http://127.0.0.1:%d  kv port -\n", k->name,
                    (int)k->pid, k->http_port);
    }
    fprintf(o,
            "duplex up: keys      %s (internal key for a proxy in front of the nodes%s; "
            "removed at exit)\n",
            L->run.dir, L->run.api_keys[0] ? ", API keys" : "");
    fprintf(o, "duplex up: ready: http://127.0.0.1:%d  (OpenAI API under /v1; Ctrl-C stops all)\n",
            router_kid(L)->http_port);
    fflush(o);
}

static void start_health(launch *L);

static void on_poll(uv_timer_t *t)
{
    start_health(t->data);
}

static void on_health_done(void *user, int rc, long status)
{
    launch *L = user;
    L->check = NULL;
    if (L->phase != PH_HEALTH) return;
    if (rc == 0 && status == 200) {
        L->phase = PH_RUNNING;
        uv_timer_stop(&L->timer);
        print_summary(L);
        return;
    }
    uv_timer_start(&L->poll, on_poll, 100, 0);
}

static int on_health_data(void *user, const char *p, size_t n)
{
    return 0;
}

static void start_health(launch *L)
{
    if (L->phase != PH_HEALTH || L->check) return;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/health", router_kid(L)->http_port);
    router_up_request rq = {.method = "GET", .url = url, .timeout_ms = 2000};
    static const router_up_cb cb = {.on_data = on_health_data, .on_done = on_health_done};
    if (router_up_start(L->up, &rq, &cb, L, &L->check) < 0) {
        fprintf(stderr, "duplex up: %s\n", dx_errmsg());
        stop_all(L, 1);
    }
}

/* Every node is up: the router, with their URLs. */
static void start_router(launch *L)
{
    dx_buf p, d;
    dx_buf_init(&p, 0);
    dx_buf_init(&d, 0);
    for (size_t i = 0; i < L->n_nodes; i++) {
        lkid *k = &L->kids[i];
        dx_buf *b = k->role == KID_PREFILL ? &p : &d;
        dx_buf_printf(b, "%shttp://127.0.0.1:%d", b->len ? "," : "", k->http_port);
    }
    router_launch_argv a;
    int rc = router_launch_router_argv(&L->cfg, p.data ? p.data : "", d.data ? d.data : "", &a);
    lkid *r = &L->kids[L->n_nodes];
    snprintf(r->name, sizeof r->name, "router");
    r->role = KID_ROUTER;
    if (rc == 0) rc = kid_spawn(L, r, a.argv);
    if (rc == 0) L->n_kids++;
    router_launch_argv_free(&a);
    dx_buf_free(&p);
    dx_buf_free(&d);
    L->phase = PH_ROUTER;
    if (rc) {
        fprintf(stderr, "duplex up: starting the router: %s\n", dx_errmsg());
        stop_all(L, 1);
    }
}

/* A child's output line: relayed; start-up lines give its ports. */
static void kid_line(lkid *k, const char *line)
{
    launch *L = k->L;
    fprintf(stderr, "[%s] %s\n", k->name, line);
    const char *a = strstr(line, "address=http://127.0.0.1:");
    int startup = a && (strstr(line, "duplex serve:") || strstr(line, "duplex router:"));
    if (!startup || k->ready || L->phase == PH_STOPPING) return;
    k->http_port = atoi(a + strlen("address=http://127.0.0.1:"));
    const char *kv = strstr(line, "kv_port=");
    const char *colon = kv ? strchr(kv, ':') : NULL;
    if (colon && strncmp(kv, "kv_port=off", 11) != 0) k->kv_port = atoi(colon + 1);
    k->ready = 1;
    if (k->role == KID_ROUTER) {
        L->phase = PH_HEALTH;
        start_health(L);
        return;
    }
    for (size_t i = 0; i < L->n_nodes; i++)
        if (!L->kids[i].ready) return;
    start_router(L);
}

static void on_child(uv_signal_t *h, int signum)
{
    launch *L = h->data;
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        for (size_t i = 0; i < L->n_kids; i++) {
            lkid *k = &L->kids[i];
            if (k->pid != pid) continue;
            k->exited = 1;
            k->status = st;
            char how[96];
            describe_exit(st, how, sizeof how);
            if (L->phase != PH_STOPPING) {
                fprintf(stderr, "duplex up: %s (pid %d) %s; stopping everything\n", k->name,
                        (int)pid, how);
                stop_all(L, 1);
            } else if (k->role == KID_ROUTER) {
                signal_kids(L, SIGTERM, 0, 1); /* the router has drained: now the nodes */
            }
        }
    }
    finish(L);
}

static void on_signal(uv_signal_t *h, int signum)
{
    launch *L = h->data;
    if (++L->signals > 1) {
        fprintf(stderr, "duplex up: %s again: killing the children\n", strsignal(signum));
        signal_kids(L, SIGKILL, 1, 1);
        return;
    }
    fprintf(stderr, "duplex up: %s: stopping the router, then the nodes\n", strsignal(signum));
    stop_all(L, 0);
}

static void on_startup_timeout(uv_timer_t *t)
{
    launch *L = t->data;
    fprintf(stderr, "duplex up: not ready within %.0f s; stopping\n", L->cfg.startup_timeout_s);
    stop_all(L, 1);
}

/* ---- run ------------------------------------------------------------------------------ */

/* The cluster's KV secret, in the run directory (see .h). */
static int make_secret(launch *L)
{
    int rc = router_rundir_add_kv_secret(&L->run);
    if (rc) return rc;
    L->cfg.kv_secret_file = L->run.kv_secret;
    fprintf(stderr, "duplex up: KV ports authenticated with a fresh secret, %s\n",
            L->run.kv_secret);
    return 0;
}

static int start_nodes(launch *L)
{
    int np = L->cfg.mode == LAUNCH_COLOCATED ? 0 : L->cfg.n_prefill;
    for (int i = 0; i < np + L->cfg.n_decode; i++) {
        lkid *k = &L->kids[L->n_kids];
        int prefill = i < np;
        k->role = prefill ? KID_PREFILL : KID_DECODE;
        snprintf(k->name, sizeof k->name, "%s%d", prefill ? "prefill" : "decode",
                 prefill ? i : i - np);
        router_launch_argv a;
        router_launch_node_argv(&L->cfg, prefill, &a);
        int rc = kid_spawn(L, k, a.argv);
        if (rc) return rc;
        L->n_kids++;
        L->n_nodes++;
    }
    return 0;
}

static void init_handles(launch *L)
{
    uv_signal_init(&L->loop, &L->sig_int);
    uv_signal_init(&L->loop, &L->sig_term);
    uv_signal_init(&L->loop, &L->sig_chld);
    uv_timer_init(&L->loop, &L->timer);
    uv_timer_init(&L->loop, &L->poll);
    L->sig_int.data = L->sig_term.data = L->sig_chld.data = L->timer.data = L->poll.data = L;
    uv_signal_start(&L->sig_int, on_signal, SIGINT);
    uv_signal_start(&L->sig_term, on_signal, SIGTERM);
    uv_signal_start(&L->sig_chld, on_child, SIGCHLD);
    uv_timer_start(&L->timer, on_startup_timeout, (uint64_t)(L->cfg.startup_timeout_s * 1e3), 0);
}

int router_launch_run(const router_launch_config *cfg)
{
    launch *L = dx_calloc(1, sizeof *L);
    size_t n = (size_t)cfg->n_prefill + (size_t)cfg->n_decode + 1;
    if (!L || !(L->kids = dx_calloc(n, sizeof *L->kids))) {
        dx_free(L);
        fprintf(stderr, "duplex up: out of memory\n");
        return 1;
    }
    L->cfg = *cfg;
    int rc = router_rundir_create(&L->run, cfg->api_keys, cfg->n_api_keys, cfg->api_key_files,
                                  cfg->n_api_key_files);
    if (rc) {
        fprintf(stderr, "duplex up: %s\n", dx_errmsg());
        dx_free(L->kids);
        dx_free(L);
        return rc == DX_EINVAL ? 2 : 1;
    }
    L->cfg.internal_key_file = L->run.internal_key;
    L->cfg.api_key_file = L->run.api_keys[0] ? L->run.api_keys : NULL;
    if (L->cfg.startup_timeout_s <= 0)
        L->cfg.startup_timeout_s = ROUTER_LAUNCH_DEFAULT_STARTUP_TIMEOUT_S;
    if (L->cfg.stop_timeout_s <= 0) L->cfg.stop_timeout_s = ROUTER_LAUNCH_DEFAULT_STOP_TIMEOUT_S;
    if (!L->cfg.out) L->cfg.out = stdout;
    uv_loop_init(&L->loop);
    init_handles(L);
    rc = router_up_create(&L->loop, &L->up);
    if (rc == 0 && L->cfg.mode != LAUNCH_COLOCATED) rc = make_secret(L);
    if (rc == 0) rc = start_nodes(L);
    if (rc) {
        fprintf(stderr, "duplex up: %s\n", dx_errmsg());
        stop_all(L, 1);
    }
    uv_run(&L->loop, UV_RUN_DEFAULT);
    for (size_t i = 0; i < L->n_kids; i++) kid_close_pipe(&L->kids[i]);
    uv_run(&L->loop, UV_RUN_DEFAULT);
    uv_loop_close(&L->loop);
    router_rundir_remove(&L->run); /* every child has exited: none reads them any more */
    int code = L->exit_code;
    dx_free(L->kids);
    dx_free(L);
    return code;
}
