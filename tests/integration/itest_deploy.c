/* itest_deploy: the deployment examples in deploy/ (Kubernetes manifests,
 * systemd units and their environment files) and the multi-host commands
 * of README.md agree with the duplex binary that runs them.
 * tests/integration/deploy_check.py does the checking (it parses the YAML
 * with python3-yaml, rebuilds every duplex command line as the pod or unit
 * would run it, and asks `duplex CMD --help` of this binary which flags
 * exist; its PENDING_FLAGS, empty since issue 14's branches were merged,
 * can name flags of branches not merged yet).  This test runs it on the repository as it stands — which must
 * pass — and on copies broken one way each, which must each fail naming
 * what was broken: a checker that passes everything would prove nothing.
 * Runs from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../test_proc.h"

#define CHECKER "tests/integration/deploy_check.py"

static const char *g_bin;
static char g_tmp[64];

static int setup(void **state)
{
    (void)state;
    g_bin = getenv("DUPLEX_BIN");
    if (!g_bin) g_bin = "build/release/duplex";
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dx_itest_deploy_XXXXXX");
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return tp_rm_rf(g_tmp);
}

/* Runs the checker with binary bin on the repository (or a copy) at dir;
 * its exit code, and its output in out. */
static int check(const char *bin, const char *dir, char *out, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 " CHECKER " '%s' '%s' 2>&1", bin, dir);
    return tp_capture(cmd, out, cap);
}

static void test_examples_pass(void **state)
{
    (void)state;
    char out[16384];
    if (system("python3 -c 'import yaml' 2>/dev/null") != 0)
        fail_msg("python3 with the yaml module is missing (scripts/deps.sh installs python3-yaml)");
    int rc = check(g_bin, ".", out, sizeof out);
    printf("%s", out);
    if (rc != 0) fail_msg("deploy/ or README.md does not agree with %s:\n%s", g_bin, out);
    assert_non_null(strstr(out, "deploy_check: ok"));
}

/* One way to break the examples: a sed script applied to one file, and
 * what the checker must then say. */
typedef struct {
    const char *file, *sed, *says;
} breakage;

static const breakage k_breakages[] = {
    /* flags */
    {"deploy/kubernetes/prefill.yaml", "s/--bidirectional-kv-xfer/--bidirectional-kv-transfer/",
     "`duplex serve --bidirectional-kv-transfer`: no such flag"},
    {"deploy/kubernetes/router.yaml", "s/- --tokenizer/- --tokeniser/",
     "`duplex router --tokeniser`: no such flag"},
    {"deploy/kubernetes/decode.yaml",
     "s/--internal-key-file \\/etc\\/duplex\\/secrets\\/internal.key;/"
     "--internal-key \\/etc\\/duplex\\/secrets\\/internal.key;/",
     "`duplex node drain --internal-key`: no such flag"},
    {"deploy/kubernetes/router.yaml", "s/\"synth\", \"--arch\"/\"synth\", \"--architecture\"/",
     "`duplex model synth --architecture`: no such flag"},
    {"deploy/systemd/duplex-router.service", "s/--tokenizer/--tokeniser/",
     "`duplex router --tokeniser`: no such flag"},
    {"deploy/systemd/prefill-1.env", "s/--shutdown-grace-s/--shutdown-grace/",
     "`duplex serve --shutdown-grace`: no such flag"},
    /* ports */
    {"deploy/kubernetes/decode.yaml",
     "s/prometheus.io\\/port: \"8201\"/prometheus.io\\/port: \"8202\"/",
     "prometheus.io/port 8202 is not the HTTP port 8201"},
    {"deploy/kubernetes/decode.yaml", "s/containerPort: 9201/containerPort: 9202/",
     "--kv-port 9201 is not a containerPort"},
    {"deploy/kubernetes/router.yaml", "s/targetPort: http/targetPort: web/",
     "targetPort web is no containerPort of Deployment duplex-router"},
    {"deploy/kubernetes/prefill.yaml", "s/port: http$/port: kv/",
     "port kv is not the HTTP port 8101"},
    {"deploy/kubernetes/redis.yaml", "s/port: 6379$/port: 6380/",
     "Service duplex-redis has no port 6379"},
    {"deploy/kubernetes/prefill.yaml", "s/127.0.0.1:8101/127.0.0.1:8100/",
     "port 8100 is not the node's --port 8101"},
    {"deploy/kubernetes/decode.yaml", "s/(POD_DNS):8201/(POD_DNS):8200/",
     "port is not --port 8201"},
    {"deploy/kubernetes/decode.yaml", "s/      port: 9201/      port: 9301/",
     "Service duplex-decode port 9301 is not the pod's port kv"},
    {"deploy/systemd/duplex-prefill@.service",
     "s/drain http:\\/\\/${DUPLEX_HOST}:${DUPLEX_PORT}/"
     "drain http:\\/\\/${DUPLEX_HOST}:9101/",
     "ExecStop drains http://10.0.0.1:9101, not the node at 10.0.0.1:8101"},
    {"deploy/systemd/decode-1.env", "s/--kv-peers 10.0.0.0\\/24/--kv-peers 10.0.1.0\\/24/",
     "does not cover the prefill node's KV address 10.0.0.1:9101"},
    /* references */
    {"deploy/kubernetes/prefill.yaml", "s/secretName: duplex-secrets/secretName: duplex-secret/",
     "Secret duplex-secret does not exist"},
    {"deploy/kubernetes/secrets.yaml", "s/^  internal.key:/  internal-key:/",
     "Secret duplex-secrets has no key internal.key"},
    {"deploy/kubernetes/config.yaml", "s/^  redis-url:/  redis:/",
     "ConfigMap duplex-config has no key redis-url"},
    {"deploy/kubernetes/decode.yaml", "s/^        - name: models$/        - name: scratch/",
     "volumeMount models: no such volume in the pod"},
    {"deploy/kubernetes/router.yaml", "s/\"\\/models\\/model.gguf\"/\"\\/models\\/m.gguf\"/",
     "--tokenizer /models/model.gguf: no initContainer writes it"},
    {"deploy/kubernetes/prefill.yaml", "s/serviceName: duplex-prefill/serviceName: duplex-prefil/",
     "serviceName duplex-prefil: no such Service"},
    {"deploy/kubernetes/prefill.yaml", "s/(POD_NAME).duplex-prefill./(POD_NAME).prefill./",
     "not the pod's stable name"},
    {"deploy/kubernetes/kustomization.yaml", "/- redis.yaml/d",
     "redis.yaml is not among its resources"},
    {"deploy/kubernetes/router.yaml", "s/$(REDIS_URL)/$(REDIS)/", "$(REDIS) is not an environment"},
    {"deploy/systemd/duplex-prefill@.service",
     "s/^LoadCredential=kv.secret/#LoadCredential=kv.secret/",
     "uses credential kv.secret (%d/kv.secret) without LoadCredential"},
    {"deploy/systemd/prefill-1.env", "s/^DUPLEX_KV_PORT=/#DUPLEX_KV_PORT=/",
     "${DUPLEX_KV_PORT} is set by no EnvironmentFile"},
    {"deploy/systemd/router.env",
     "s/--discover redis:\\/\\/10.0.0.1:6379\\/0/"
     "--discover redis:\\/\\/10.0.0.1:6379\\/1/",
     "nodes register at ['redis://10.0.0.1:6379/0'] but routers discover at"},
    {"deploy/systemd/duplex-decode@.service", "s/^Restart=on-failure/Restart=no/",
     "no Restart=on-failure"},
    {"deploy/systemd/duplex-decode@.service", "/^ExecStop=/d", "no ExecStop that drains the node"},
    {"README.md", "s/--kv-port 9201 --kv-peers/--kv-port 9201 --kv-peer/",
     "`duplex serve --kv-peer`: no such flag"},
    {"README.md",
     "s/duplex router --host 0.0.0.0 --port 8000 --tokenizer $M --state/"
     "duplex router --host 0.0.0.0 --port 8000 --tokenizer $M --stat/",
     "`duplex router --stat`: no such flag"},
    /* YAML */
    {"deploy/kubernetes/redis.yaml", "$a\\  oops: [", "kubernetes/redis.yaml: does not parse"},
};

/* A fresh copy of what the checker reads (deploy/, README.md) in
 * g_tmp/copy, broken by b. */
static void broken_copy(const breakage *b, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/copy", g_tmp);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && mkdir '%s' && cp -r deploy README.md '%s' && sed -i '%s' '%s/%s'", dir,
             dir, dir, b->sed, dir, b->file);
    assert_int_equal(system(cmd), 0);
    /* the sed script must have changed something, else the case tests nothing */
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s/%s'", b->file, dir, b->file);
    if (system(cmd) == 0) fail_msg("%s: sed '%s' changed nothing", b->file, b->sed);
}

static void test_breakages_caught(void **state)
{
    (void)state;
    int missed = 0;
    for (size_t i = 0; i < sizeof k_breakages / sizeof k_breakages[0]; i++) {
        const breakage *b = &k_breakages[i];
        char dir[128], out[16384];
        broken_copy(b, dir, sizeof dir);
        int rc = check(g_bin, dir, out, sizeof out);
        if (rc == 1 && strstr(out, b->says)) continue;
        missed++;
        printf("# %s, sed '%s': exit %d, want 1 and '%s':\n%s\n", b->file, b->sed, rc, b->says,
               out);
    }
    if (missed) fail_msg("%d broken examples not caught as they should be (above)", missed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples_pass),
        cmocka_unit_test(test_breakages_caught),
    };
    return cmocka_run_group_tests_name("deploy/ against duplex --help", tests, setup, teardown);
}
