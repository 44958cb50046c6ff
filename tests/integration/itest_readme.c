/* itest_readme: the README's examples run verbatim.  Every ```sh block that
 * follows a `<!-- readme-test -->` line is run as it stands, from the
 * repository root, by `bash -e`, in a process group of its own: it must exit
 * 0, and whatever it left running is stopped afterwards.  The blocks use
 * build/release/duplex and models/qwen3-small-bf16.gguf, as a user would
 * after `make demo`: the model is written first if it is missing, and the
 * test runs once, with the release binary (other variants report skipped).
 * The examples use fixed ports (8000, 8001, 8101, 8201, and 6390 for Redis):
 * they must be free. */
/* duplex-test: alone */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test_proc.h"

#define MODEL "models/qwen3-small-bf16.gguf"

static int port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Runs one block; its output goes to the test's log. */
static void run_block(const char *code, int index)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/dx_readme_%d_%d.sh", (int)getpid(), index);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(code, f);
    fclose(f);
    printf("# README example %d:\n%s", index, code);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/bash", "bash", "-e", path, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    int st = 0, done = 0;
    for (int i = 0; i < 1200 && !done; i++) { /* 120 s: a hang is a failure */
        done = waitpid(pid, &st, WNOHANG) == pid;
        if (!done) usleep(100000);
    }
    /* at-rest: what a README example left running, stopped as a user would */
    kill(-pid, SIGTERM);
    usleep(300000);
    kill(-pid, SIGKILL);
    if (!done) waitpid(pid, &st, 0);
    unlink(path);
    if (!done) fail_msg("README example %d did not finish within 120 s", index);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("README example %d failed (status %d)", index, st);
}

static void test_readme_examples(void **state)
{
    (void)state;
    const char *bin = getenv("DUPLEX_BIN");
    if (bin && strcmp(bin, "build/release/duplex") != 0) {
        printf("# the README names build/release/duplex: run with that variant only\n");
        skip();
    }
    static const int ports[] = {8000, 8001, 8101, 8201, 6390};
    for (size_t i = 0; i < sizeof ports / sizeof *ports; i++)
        if (!port_free(ports[i]))
            fail_msg("port %d is busy: the README's examples need it", ports[i]);
    if (access(MODEL, R_OK) != 0)
        assert_int_equal(system("mkdir -p models && build/release/duplex model synth --arch qwen3 "
                                "--preset small --dtype bf16 --seed 1 -o " MODEL " >/dev/null"),
                         0);
    size_t n;
    char *md = tp_slurp("README.md", &n);
    assert_non_null(md);
    int found = 0;
    for (const char *p = md; (p = strstr(p, "<!-- readme-test -->"));) {
        const char *open = strstr(p, "```sh\n");
        assert_non_null(open);
        open += 6;
        const char *close = strstr(open, "\n```");
        assert_non_null(close);
        char *code = strndup(open, (size_t)(close - open + 1));
        run_block(code, ++found);
        free(code);
        p = close;
    }
    free(md);
    /* the server, with an API key, the three front doors, structured outputs, duplex up,
     * P/D by hand, two routers sharing Redis */
    assert_int_equal(found, 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_readme_examples)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
