/* itest_scripts: what `make test` and `make demo` print, through
 * scripts/lib.sh with stand-in test programs and a stand-in make: each
 * test's summary lines come before its verdict line, the closing
 * "N passed, N failed[, N skipped]" line and the exit status, the build's
 * stage lines with their time, and compiler messages passing the progress
 * filter while the Makefile's step lines do not; which tests run under
 * ThreadSanitizer, read from the mark in their sources.  And
 * scripts/check_layers.sh, a copy run on tiny trees in a temporary
 * directory: a clean tree passes; an upward include or call, an unknown
 * folder, a private header included from another folder and two files of
 * one folder calling each other each fail naming the files, and the pair
 * passes once listed in ALLOWED.  Runs from the repository root. */
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
    /* the layer check's trees: tree T makes one, objs T compiles it into
     * the BUILD layout the script reads (nm), check T runs T's copy of the
     * script from elsewhere (it finds its tree from its own path) */
    write_exe("layers.sh",
              "tree() {\n"
              "    rm -rf \"$1\" && mkdir -p \"$1/scripts\" \"$1/src/base\" \"$1/src/engine\" &&\n"
              "    cp scripts/check_layers.sh \"$1/scripts/\" &&\n"
              "    echo 'int a(void);' >\"$1/src/base/a.h\" &&\n"
              "    printf '#include \"base/a.h\"\\nint a(void) { return 1; }\\n' "
              ">\"$1/src/base/a.c\" &&\n"
              "    echo 'int b(void);' >\"$1/src/engine/b.h\" &&\n"
              "    printf '#include \"base/a.h\"\\n#include \"engine/b.h\"\\n"
              "int b(void) { return a(); }\\n' >\"$1/src/engine/b.c\"\n"
              "}\n"
              "objs() {\n"
              "    local c o\n"
              "    for c in $(cd \"$1\" && find src -name '*.c'); do\n"
              "        o=$1/build/release/obj/${c%.c}.o\n"
              "        mkdir -p \"${o%/*}\" && cc -c -I\"$1/src\" \"$1/$c\" -o \"$o\" || return 1\n"
              "    done\n"
              "}\n"
              "check() { (cd / && BUILD=build/release bash \"$1/scripts/check_layers.sh\"); }\n");
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
    rc = bash(out, sizeof out,
              "run_one v/ok %1$s/ok.sh\nrun_one v/plain %1$s/plain.sh\n"
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

/* tsan_wanted reads the mark from the source a test program was built
 * from: a line of its own before the first #include. */
static void test_tsan_mark(void **state)
{
    (void)state;
    char out[4096];
    int rc = bash(out, sizeof out,
                  "cd %s && mkdir -p tests/unit tests/integration\n"
                  "m='/* duplex-test: tsan */'\n"
                  "printf '/* a */\\n%%s\\n#include <a.h>\\n' \"$m\" >tests/unit/test_a.c\n"
                  "printf '/* b */\\n#include <b.h>\\n' >tests/unit/test_b.c\n"
                  "printf '/* c */\\n#include <c.h>\\n%%s\\n' \"$m\" >tests/unit/test_c.c\n"
                  "printf '/* d */\\n%%s\\n#include <d.h>\\n' \"$m\" >tests/integration/itest_d.c\n"
                  "printf '/* e */\\n%%s int e;\\n#include <e.h>\\n' \"$m\" >tests/unit/test_e.c\n"
                  "for n in test_a test_b test_c itest_d test_e test_none other; do\n"
                  "    tsan_wanted $n && echo \"$n yes\" || echo \"$n no\"\n"
                  "done",
                  g_dir);
    assert_int_equal(rc, 0);
    assert_string_equal(out, "test_a yes\ntest_b no\ntest_c no\nitest_d yes\ntest_e no\n"
                             "test_none no\nother no\n");
}

/* Runs the layer check on the tiny tree g_dir/lt after the shell commands
 * `change` (with T set to the tree) made it wrong; its output and "status
 * N" in out. */
static void layers(char *out, size_t cap, const char *change)
{
    bash(out, cap,
         ". %1$s/layers.sh\nT=%1$s/lt\ntree \"$T\" || exit 1\n%2$s\n"
         "objs \"$T\" && check \"$T\"\necho \"status $?\"",
         g_dir, change);
}

static void expect_in(const char *out, const char *want)
{
    if (!strstr(out, want)) fail_msg("no \"%s\" in:\n%s", want, out);
}

static void test_layers_clean(void **state)
{
    (void)state;
    char out[8192];
    layers(out, sizeof out, ":");
    expect_in(out, "layers hold: base ");
    expect_in(out, "\nstatus 0\n");
}

static void test_layers_upward(void **state)
{
    (void)state;
    char out[8192];
    layers(out, sizeof out, "echo '#include \"engine/b.h\"' >>\"$T/src/base/a.c\"");
    expect_in(out, "src/base/a.c: includes upward: base (0) → engine (");
    expect_in(out, "\"engine/b.h\"");
    expect_in(out, "layer check failed");
    expect_in(out, "\nstatus 1\n");
    layers(out, sizeof out,
           "echo 'int b(void); int a2(void) { return b(); }' >>\"$T/src/base/a.c\"");
    expect_in(out, "src/base/a.c calls upward into src/engine/b.c (base → engine)");
    expect_in(out, "\nstatus 1\n");
}

static void test_layers_unknown_folder(void **state)
{
    (void)state;
    char out[8192];
    layers(out, sizeof out,
           "mkdir \"$T/src/extra\" && echo 'int x(void);' >\"$T/src/extra/x.h\"\n"
           "echo '#include \"extra/x.h\"' >\"$T/src/extra/x.c\"\n"
           "echo '#include \"extra/x.h\"' >>\"$T/src/engine/b.c\"");
    expect_in(out, "src/extra: a folder that is not in LAYERS");
    expect_in(out, "src/engine/b.c: includes \"extra/…\", a folder that is not in LAYERS");
    expect_in(out, "\nstatus 1\n");
}

/* A private header: its own folder and tests/ may include it, another
 * folder may not, even one above it. */
static void test_layers_private(void **state)
{
    (void)state;
    char out[8192];
    layers(out, sizeof out,
           "echo 'int a2(void);' >\"$T/src/base/a_priv.h\"\n"
           "echo '#include \"base/a_priv.h\"' >>\"$T/src/base/a.c\"\n"
           "mkdir -p \"$T/tests\" && echo '#include \"base/a_priv.h\"' >\"$T/tests/t.c\"");
    expect_in(out, "layers hold: base ");
    expect_in(out, "\nstatus 0\n");
    layers(out, sizeof out,
           "echo 'int a2(void);' >\"$T/src/base/a_priv.h\"\n"
           "echo '#include \"base/a_priv.h\"' >>\"$T/src/engine/b.c\"");
    expect_in(out, "src/engine/b.c: includes \"base/a_priv.h\", private to src/base/");
    expect_in(out, "layer check failed");
    expect_in(out, "\nstatus 1\n");
}

/* Two files of base calling each other: p → q → p. */
#define CIRCLE                                                                                     \
    "echo 'int q(void); int p(int n) { return n ? q() : 0; }' >\"$T/src/base/p.c\"\n"              \
    "echo 'int p(int); int q(void) { return p(0); }' >\"$T/src/base/q.c\""

static void test_layers_circle(void **state)
{
    (void)state;
    char out[8192];
    layers(out, sizeof out, CIRCLE);
    const char *line = strstr(out, "src/base: files that call each other in a circle: ");
    if (!line) fail_msg("no circle reported:\n%s", out);
    const char *end = strchr(line, '\n');
    if (!end || !memmem(line, (size_t)(end - line), "src/base/p", 10) ||
        !memmem(line, (size_t)(end - line), "src/base/q", 10))
        fail_msg("the circle's line does not name both files:\n%s", out);
    expect_in(out, "\nstatus 1\n");
    /* the same pair listed in ALLOWED (the test's copy of the script) */
    layers(out, sizeof out,
           CIRCLE "\nsed -i 's|^ALLOWED=($|&\\n    \"base/p base/q listed by itest_scripts\"|' "
                  "\"$T/scripts/check_layers.sh\"\n"
                  "grep -q '\"base/p base/q listed' \"$T/scripts/check_layers.sh\" || exit 1");
    expect_in(out, "layers hold: base ");
    expect_in(out, "\nstatus 0\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_test_blocks),           cmocka_unit_test(test_build_progress),
        cmocka_unit_test(test_build_stage),           cmocka_unit_test(test_tsan_mark),
        cmocka_unit_test(test_layers_clean),          cmocka_unit_test(test_layers_upward),
        cmocka_unit_test(test_layers_unknown_folder), cmocka_unit_test(test_layers_circle),
        cmocka_unit_test(test_layers_private),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
