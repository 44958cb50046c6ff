/* bench_fake: an instant OpenAI endpoint on its own loop thread (see .h). */
#include "bench/bench_fake.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "bench/bench_report.h"
#include "bench/bench_run.h"
#include "http/http_conn.h"

struct bench_fake {
    bench_fake_config cfg;
    uv_loop_t loop;
    uv_async_t stop;
    http_srv *srv;
    pthread_t th;
    unsigned n_chat;
};

static void stream_answer(http_conn *c, int max_tokens, int cut)
{
    dx_buf b;
    dx_buf_init(&b, 0);
    const char *head = "data: {\"id\":\"fake\",\"object\":\"chat.completion.chunk\",\"choices\":[{"
                       "\"index\":0,\"delta\":";
    if (http_conn_stream_begin(c, 200, "text/event-stream", NULL) < 0) return;
    dx_buf_printf(&b, "%s{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
                  head);
    for (int i = 0; i < max_tokens; i++) {
        if (cut && i == 2) { /* a node dying mid-answer */
            http_conn_stream_write(c, b.data, b.len);
            http_conn_abort(c);
            dx_buf_free(&b);
            return;
        }
        dx_buf_printf(&b, "%s{\"content\":\"w%d \"},\"finish_reason\":null}]}\n\n", head, i);
    }
    dx_buf_printf(&b, "%s{},\"finish_reason\":\"length\"}]}\n\n", head);
    dx_buf_printf(&b,
                  "data: {\"id\":\"fake\",\"object\":\"chat.completion.chunk\",\"choices\":[],"
                  "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":%d,\"total_tokens\":%d,"
                  "\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n",
                  max_tokens, max_tokens + 10);
    if (http_conn_stream_write(c, b.data, b.len) == 0) http_conn_stream_end(c);
    dx_buf_free(&b);
}

static void on_request(void *user, http_conn *c, const http_req *r)
{
    bench_fake *f = user;
    if (!strcmp(r->path, "/v1/models")) {
        const char *b = "{\"object\":\"list\",\"data\":[{\"id\":\"fake\",\"object\":\"model\"}]}";
        http_conn_respond(c, 200, "application/json", NULL, b, strlen(b));
        return;
    }
    if (strcmp(r->path, "/v1/chat/completions")) {
        http_conn_respond(c, 404, "application/json", NULL, "{}", 2);
        return;
    }
    unsigned n = ++f->n_chat;
    if (f->cfg.stall_every && n % f->cfg.stall_every == 0) return; /* never answered */
    if (f->cfg.fail_every && n % f->cfg.fail_every == 0) {
        const char *b = "{\"error\":{\"message\":\"injected failure\",\"type\":\"server_error\"}}";
        http_conn_respond(c, 500, "application/json", NULL, b, strlen(b));
        return;
    }
    json_error_t je;
    json_t *v = json_loadb(r->body, r->body_len, 0, &je);
    json_t *mt = json_object_get(v, "max_tokens");
    int max_tokens = json_is_integer(mt) ? (int)json_integer_value(mt) : 16;
    if (max_tokens > 100000) max_tokens = 100000;
    json_decref(v);
    stream_answer(c, max_tokens, f->cfg.cut_every && n % f->cfg.cut_every == 0);
}

static void on_stop(uv_async_t *a)
{
    bench_fake *f = a->data;
    http_srv_destroy(f->srv);
    uv_close((uv_handle_t *)&f->stop, NULL);
}

static void *fake_main(void *arg)
{
    bench_fake *f = arg;
    uv_run(&f->loop, UV_RUN_DEFAULT);
    return NULL;
}

int bench_fake_start(const bench_fake_config *cfg, bench_fake **out)
{
    *out = NULL;
    bench_fake *f = dx_calloc(1, sizeof *f);
    if (!f) return dx_errf(DX_ENOMEM, "out of memory");
    f->cfg = *cfg;
    uv_loop_init(&f->loop);
    http_srv_config hc = {.host = "127.0.0.1", .port = 0, .on_request = on_request, .user = f};
    int rc = http_srv_create(&f->loop, &hc, &f->srv);
    if (rc) {
        uv_run(&f->loop, UV_RUN_DEFAULT);
        uv_loop_close(&f->loop);
        dx_free(f);
        return rc;
    }
    uv_async_init(&f->loop, &f->stop, on_stop);
    f->stop.data = f;
    if (pthread_create(&f->th, NULL, fake_main, f)) {
        on_stop(&f->stop); /* on this thread: the loop never ran elsewhere */
        uv_run(&f->loop, UV_RUN_DEFAULT);
        uv_loop_close(&f->loop);
        dx_free(f);
        return dx_errf(DX_ENOMEM, "cannot start the fake endpoint's thread");
    }
    *out = f;
    return 0;
}

int bench_fake_port(const bench_fake *f)
{
    return http_srv_port(f->srv);
}

void bench_fake_stop(bench_fake *f)
{
    if (!f) return;
    uv_async_send(&f->stop);
    pthread_join(f->th, NULL);
    uv_loop_close(&f->loop);
    dx_free(f);
}

double bench_fake_overhead_ms(const bench_workload *w, bench_text *text, const volatile int *stop)
{
    bench_fake *f;
    if (bench_fake_start(&(bench_fake_config){0}, &f)) return BENCH_UNKNOWN;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", bench_fake_port(f));
    bench_results r;
    bench_run_config rc = {.url = url, .w = w, .text = text, .stop = stop};
    double p50 = BENCH_UNKNOWN;
    if (bench_run(&rc, &r) == 0) {
        double *v = dx_malloc((r.n ? r.n : 1) * sizeof *v);
        size_t k = 0;
        for (size_t i = 0; v && i < r.n; i++)
            if (!r.rec[i].err) v[k++] = r.rec[i].ttft_s;
        bench_stat st;
        bench_stat_of(v, k, &st);
        if (k) p50 = st.p50 * 1e3;
        dx_free(v);
        bench_results_free(&r);
    }
    bench_fake_stop(f);
    return p50;
}
