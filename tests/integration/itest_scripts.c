/* itest_scripts: what `make test` and `make demo` print, through
 * scripts/lib.sh with stand-in test programs and a stand-in make: each
 * test's summary lines come before its verdict line, the closing
 * "N passed, N failed[, N skipped]" line and the exit status, the build's
 * stage lines with their time, and compiler messages passing the progress
 * filter while the Makefile's step lines do not.  Runs from the repository
 * root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test_proc.h"

static char g_dir[64];

/* Runs a bash script (with scripts/lib.sh sourced) and captures its stdout
 * and stderr into out; returns the exit status. */
static int bash(char *out, size_t cap, const char *fmt, ...)
{
    char body[2048], path[128], cmd[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s/script.sh", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, ". scripts/lib.sh\nlog_dir=%s\n%s\n", g_dir, body);
    fclose(f);
    snprintf(cmd, sizeof cmd, "bash %s 2>&1", path);
    return tp_capture(cmd, out, cap);
}

/* Whether the whole of s matches the extended regular expression re
 * (times are matched, never assumed: "[0-9]+ s"). */
static int matches(const char *s, const char *re)
{
    regex_t r;
    char full[1024];
    snprintf(full, sizeof full, "^%s$", re);
    assert_int_equal(regcomp(&r, full, REG_EXTENDED | REG_NOSUB), 0);
    int ok = regexec(&r, s, 0, NULL, 0) == 0;
    regfree(&r);
    return ok;
}

static void write_exe(const char *name, const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, 0755), 0);
}

static int setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/dx_itest_scripts_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    /* stand-ins for test programs: cmocka-like output, a failure, a skip,
     * and a program that prints no cmocka lines at all */
    write_exe("ok.sh", "#!/bin/sh\necho '[==========] Running 2 test(s).'\n"
                       "echo '[==========] 2 test(s) run.'\necho '[  PASSED  ] 2 test(s).'\n");
    write_exe("bad.sh", "#!/bin/sh\necho 'some output'\necho '[==========] 3 test(s) run.'\n"
                        "echo '[  PASSED  ] 2 test(s).'\necho '[  FAILED  ] 1 test(s), listed "
                        "below:'\nexit 1\n");
    write_exe("skip.sh", "#!/bin/sh\necho '[==========] 2 test(s) run.'\n"
                         "echo '[  PASSED  ] 1 test(s).'\necho '[  SKIPPED ] 1 test(s).'\n");
    write_exe("plain.sh", "#!/bin/sh\necho 'no cmocka here'\n");
    /* a stand-in make: two steps, a compiler message, and $MAKE_RC */
    write_exe("make", "#!/bin/sh\necho '  CC  src/a.c'\necho 'src/a.c:1:1: error: boom'\n"
                      "echo '  LD  build/x/duplex'\nexit ${MAKE_RC:-0}\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tp_rm_rf(g_dir);
}

/* Every test's block ends with its verdict line: nothing of a test follows
 * its verdict, and the closing line counts what the programs reported. */
static void test_test_blocks(void **state)
{
    (void)state;
    char out[16384];
    int rc = bash(out, sizeof out,
                  "run_one v/ok %1$s/ok.sh\nrun_one v/bad %1$s/bad.sh\n"
                  "run_one v/skip %1$s/skip.sh\nrun_one v/plain %1$s/plain.sh\ntest_summary",
                  g_dir);
    assert_int_not_equal(rc, 0);
    const char *ok = strstr(out, "\nok   v/ok (2 passed, ");
    const char *bad = strstr(out, "\nFAIL v/bad (rc=1, ");
    const char *skip = strstr(out, "\nok   v/skip (1 passed, 1 skipped, ");
    const char *plain = strstr(out, "\nok   v/plain (1 passed, ");
    if (!ok || !bad || !skip || !plain) fail_msg("a verdict line is missing:\n%s", out);
    /* each block: its summary lines, then its verdict; the next block after */
    const char *ok_sum = strstr(out, "    [  PASSED  ] 2 test(s).");
    const char *bad_log = strstr(out, "    some output\n");
    const char *bad_fail = strstr(out, "    [  FAILED  ] 1 test(s)");
    const char *skip_sum = strstr(out, "    [  SKIPPED ] 1 test(s).");
    if (!ok_sum || !bad_log || !bad_fail || !skip_sum) fail_msg("a summary is missing:\n%s", out);
    if (!(ok_sum < ok && ok < bad_log && bad_log < bad_fail && bad_fail < bad && bad < skip_sum &&
          skip_sum < skip && skip < plain))
        fail_msg("blocks out of order:\n%s", out);
    assert_null(strstr(plain + 1, "    ")); /* a program without cmocka lines: none shown */
    const char *tail = strstr(out, "\nfailed: v/bad\n6 passed, 1 failed, 1 skipped\n");
    if (!tail || tail[strlen("\nfailed: v/bad\n6 passed, 1 failed, 1 skipped\n")])
        fail_msg("closing lines wrong:\n%s", out);
    /* all passing: status 0, no "failed:" line, no ", N skipped" */
    rc = bash(out, sizeof out, "run_one v/ok %1$s/ok.sh\nrun_one v/plain %1$s/plain.sh\n"
                               "test_summary",
              g_dir);
    assert_int_equal(rc, 0);
    if (!matches(out, "(.|\n)*\nok   v/plain \\(1 passed, [0-9]+s\\)\n\n3 passed, 0 failed\n") ||
        strstr(out, "failed:"))
        fail_msg("closing lines wrong:\n%s", out);
}

/* The Makefile's step lines are what the progress filter expects: in plain
 * mode (a log) they vanish and compiler messages stay, whole. */
static void test_build_progress(void **state)
{
    (void)state;
    char out[8192];
    int rc = bash(out, sizeof out,
                  "{ make -s --no-print-directory --eval 'say-x: ; $(call say,CC,src/x.c)' say-x;"
                  "  echo 'src/x.c:2:3: error: expected ; before }'; } | build_progress b plain");
    assert_int_equal(rc, 0);
    assert_string_equal(out, "src/x.c:2:3: error: expected ; before }\n");
    /* on a terminal: one status line rewritten in place, cleared at the end */
    rc = bash(out, sizeof out,
              "printf '  CC  src/a.c\\nwarning: w\\n  LD  bin\\n' |"
              "build_progress 'build (x)' tty");
    assert_int_equal(rc, 0);
    assert_string_equal(out, "\r\033[K== build (x) … [1] CC  src/a.c\r\033[Kwarning: w\n"
                             "\r\033[K== build (x) … [2] LD  bin\r\033[K");
}

/* A build stage, with a stand-in make: its start and end lines in a log,
 * the time on the end line, make's status and messages passed on. */
static void test_build_stage(void **state)
{
    (void)state;
    char out[8192];
    int rc = bash(out, sizeof out, "PATH=%s:$PATH build x all", g_dir);
    assert_int_equal(rc, 0);
    if (!matches(out, "== build \\(x\\) …\nsrc/a.c:1:1: error: boom\n"
                      "== build \\(x\\) … [0-9]+ s\n"))
        fail_msg("build stage lines wrong:\n%s", out);
    rc = bash(out, sizeof out, "PATH=%s:$PATH MAKE_RC=2 build x all; echo \"status $?\"", g_dir);
    assert_int_equal(rc, 0);
    if (!matches(out, "== build \\(x\\) …\nsrc/a.c:1:1: error: boom\n"
                      "== build \\(x\\) failed after [0-9]+ s\nstatus 2\n"))
        fail_msg("failed build stage lines wrong:\n%s", out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_test_blocks),
        cmocka_unit_test(test_build_progress),
        cmocka_unit_test(test_build_stage),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
