/* cli_node: `duplex node drain URL` — asks a running node to drain (POST
 * URL/admin/drain, docs/router.md "Draining a node"): it takes no new
 * requests, finishes the running ones, keeps serving its retained KV to
 * peers, then removes its registration and exits 0.  The same as sending
 * the node SIGUSR1, for a node on another host. */
#include "cli.h"

#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

#include "base/dx_addr.h"
#include "base/dx_buf.h"
#include "base/dx_err.h"
#include "base/dx_keys.h"
#include "http/http_auth.h"

static size_t on_body(char *p, size_t size, size_t n, void *user)
{
    dx_buf *b = user;
    dx_buf_append(b, p, size * n); /* bounded by the buffer's maximum: the rest is cut */
    return size * n;
}

/* POSTs URL/admin/drain with the key (or none); 0, or 1 after a message. */
#define DRAIN_TIMEOUT_S 30 /* node drain's --timeout-s unless told */

static int post_drain(const char *base, const char *key, const char *api_key, long timeout_s)
{
    char url[300], hdr[600];
    snprintf(url, sizeof url, "%s/admin/drain", base);
    dx_buf body;
    dx_buf_init(&body, 4096);
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    if (key) {
        snprintf(hdr, sizeof hdr, "%s: %s", HTTP_AUTH_INTERNAL_HEADER, key);
        h = curl_slist_append(h, hdr);
    } else if (api_key) {
        snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", api_key);
        h = curl_slist_append(h, hdr);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    int ret = 0;
    if (rc != CURLE_OK) {
        fprintf(stderr, "duplex node drain: %s: %s\n", url, curl_easy_strerror(rc));
        ret = 1;
    } else if (status != 200) {
        fprintf(stderr, "duplex node drain: %s answered %ld: %.*s\n", url, status, (int)body.len,
                body.data ? body.data : "");
        ret = 1;
    } else
        printf("%.*s\n", (int)body.len, body.data ? body.data : "");
    dx_buf_free(&body);
    return ret;
}

static int cli_node_drain(int argc, char **argv)
{
    const char *key_file = NULL, *api_key = NULL;
    long timeout = DRAIN_TIMEOUT_S;
    char *pos[1];
    int npos = 0;
    const cli_opt opts[] = {
        {"internal-key-file", CLI_PATH, &key_file, 0, 0,
         "the cluster's internal key (required when the node has one)"},
        {"api-key", CLI_STR, &api_key, 0, 0,
         "an API key of the node's, when it has API keys but no internal key"},
        {"timeout-s", CLI_INT, &timeout, 1, 3600,
         "how long to wait for the node's answer (" CLI_DEFAULT_INT(DRAIN_TIMEOUT_S) ")"},
    };
    int rc = cli_parse("node drain", "URL [--internal-key-file FILE]", argc, argv, opts,
                       DX_ARRAY_LEN(opts), pos, 1, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos != 1) return cli_required("node drain", "the node's URL (http://HOST:PORT)");
    char url[256];
    if (dx_addr_http_url(pos[0], url, sizeof url) < 0) {
        fprintf(stderr, "duplex node drain: %s\n", dx_errmsg());
        return 2;
    }
    char *key = NULL;
    if (key_file && dx_keys_read_one(key_file, HTTP_AUTH_INTERNAL_MIN, &key) < 0)
        return cli_bad_value("node drain", "--internal-key-file");
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = post_drain(url, key, api_key, timeout);
    curl_global_cleanup();
    dx_keys_free_secret(key);
    return rc;
}

int cli_node_main(int argc, char **argv)
{
    static const cli_cmd cmds[] = {
        {"drain", cli_node_drain,
         "URL: the node takes no new requests, finishes its own, then exits (as on SIGUSR1)"},
    };
    return cli_group("node", cmds, DX_ARRAY_LEN(cmds), argc, argv);
}
