/* itest_docs: every relative link in README.md, docs/NAME.md and
 * deploy/NAME.md leads to a file or folder of the repository, and a
 * #fragment to a heading of the target (GitHub's anchors: lowercase, spaces
 * to '-', punctuation dropped, "-1", "-2" for repeated headings).  A link
 * that leaves the repository (../shared/x.md) fails even when the file
 * exists out there: readers of the repository do not have it.  Links inside
 * code (fenced or `inline`) and http(s)/mailto links are not checked.  Runs
 * from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../test_proc.h"

/* GitHub's anchor for a heading's text: ASCII letters lowercased, digits,
 * '-', '_' and non-ASCII bytes kept, spaces to '-', everything else dropped. */
static void slug(const char *text, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++) {
        unsigned char c = (unsigned char)text[i];
        if (isalnum(c) || c == '-' || c == '_' || c >= 0x80)
            out[k++] = (char)tolower(c);
        else if (c == ' ')
            out[k++] = '-';
    }
    out[k] = 0;
}

static int is_fence(const char *line)
{
    line += strspn(line, " ");
    return !strncmp(line, "```", 3) || !strncmp(line, "~~~", 3);
}

/* Whether the markdown text has a heading whose anchor is `anchor`. */
static int has_anchor(const char *md, const char *anchor)
{
    char seen[256][128];
    int n_seen = 0, in_fence = 0;
    for (const char *line = md; *line;) {
        size_t len = strcspn(line, "\n");
        size_t hashes = strspn(line, "#");
        if (is_fence(line)) in_fence = !in_fence;
        if (!in_fence && hashes >= 1 && hashes <= 6 && line[hashes] == ' ') {
            const char *t = line + hashes + 1;
            size_t tn = len - hashes - 1;
            while (tn && (t[tn - 1] == '#' || t[tn - 1] == ' ')) tn--; /* closing #s */
            char s[128], full[160];
            slug(t, tn, s, sizeof s);
            int dup = 0;
            for (int i = 0; i < n_seen; i++) dup += !strcmp(seen[i], s);
            if (n_seen < 256) strcpy(seen[n_seen++], s);
            snprintf(full, sizeof full, dup ? "%s-%d" : "%s", s, dup);
            if (!strcmp(full, anchor)) return 1;
        }
        line += len + (line[len] == '\n');
    }
    return 0;
}

/* dir/target made relative to the repository root, ".." and "." folded;
 * -1 when it climbs out of the root.  A leading '/' is the root itself. */
static int resolve(const char *dir, const char *target, char *out, size_t cap)
{
    char tmp[PATH_MAX * 2 + 2];
    snprintf(tmp, sizeof tmp, "%s/%s", target[0] == '/' ? "" : dir, target);
    size_t k = 0;
    out[0] = 0;
    for (char *save, *c = strtok_r(tmp, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (!strcmp(c, ".")) continue;
        if (!strcmp(c, "..")) {
            if (k == 0) return -1;
            while (k > 0 && out[k - 1] != '/') k--;
            k -= k > 0;
            out[k] = 0;
            continue;
        }
        k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? "/" : "", c);
        if (k >= cap) return -1;
    }
    if (k == 0) snprintf(out, cap, ".");
    return 0;
}

/* Whether path (under root) is inside root once symbolic links are followed. */
static int inside(const char *root, const char *path)
{
    char r[PATH_MAX], p[PATH_MAX], full[PATH_MAX * 2];
    snprintf(full, sizeof full, "%s/%s", root, path);
    if (!realpath(root, r) || !realpath(full, p)) return 0;
    size_t n = strlen(r);
    return !strncmp(p, r, n) && (p[n] == '/' || p[n] == 0);
}

/* Checks one link target found at md:line; prints a line per problem. */
static int check_target(const char *root, const char *md, int line, const char *target,
                        FILE *report)
{
    if (!strncmp(target, "http://", 7) || !strncmp(target, "https://", 8) ||
        !strncmp(target, "mailto:", 7))
        return 0;
    const char *hash = strchr(target, '#');
    char path[PATH_MAX], dir[PATH_MAX], rel[PATH_MAX], full[PATH_MAX * 2];
    snprintf(path, sizeof path, "%.*s", (int)(hash ? hash - target : (long)strlen(target)),
             target);
    snprintf(dir, sizeof dir, "%s", md);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        strcpy(dir, ".");
    struct stat st;
    int out = path[0] ? resolve(dir, path, rel, sizeof rel) < 0 : 0;
    if (!path[0]) snprintf(rel, sizeof rel, "%s", md); /* "#anchor": this file */
    snprintf(full, sizeof full, "%s/%s", root, rel);
    if (!out && stat(full, &st) != 0) {
        fprintf(report, "%s:%d: (%s): no such file or folder in the repository\n", md, line,
                target);
        return 1;
    }
    if (out || !inside(root, rel)) {
        fprintf(report, "%s:%d: (%s) points outside the repository\n", md, line, target);
        return 1;
    }
    if (!hash || !S_ISREG(st.st_mode)) return 0;
    char *text = tp_slurp(full, NULL);
    int ok = text && has_anchor(text, hash + 1);
    free(text);
    if (ok) return 0;
    fprintf(report, "%s:%d: (%s): %s has no heading with anchor '#%s'\n", md, line, target, rel,
            hash + 1);
    return 1;
}

/* One line's links: "](target)" and "[ref]: target", skipping `code`. */
static int check_line(const char *root, const char *md, int lineno, const char *s, size_t n,
                      FILE *report, int *links)
{
    int bad = 0, in_code = 0;
    size_t lead = strspn(s, " ");
    if (s[lead] == '[') {
        const char *def = strstr(s + lead, "]: ");
        if (def && def < s + n && !memchr(s + lead, '`', (size_t)(def - s - lead))) {
            char t[PATH_MAX];
            const char *v = def + 3 + strspn(def + 3, " ");
            snprintf(t, sizeof t, "%.*s", (int)strcspn(v, " \n"), v);
            (*links)++;
            return check_target(root, md, lineno, t, report);
        }
    }
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] == '`') in_code = !in_code;
        if (in_code || s[i] != ']' || s[i + 1] != '(') continue;
        const char *t = s + i + 2;
        size_t tn = strcspn(t, ") \n");
        if (t[0] == '<') tn = strcspn(++t, ">\n");
        char target[PATH_MAX];
        snprintf(target, sizeof target, "%.*s", (int)tn, t);
        (*links)++;
        bad += check_target(root, md, lineno, target, report);
    }
    return bad;
}

/* Checks every link of root/md; returns the number of bad ones. */
static int check_md(const char *root, const char *md, FILE *report, int *links)
{
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%s/%s", root, md);
    char *text = tp_slurp(path, NULL);
    if (!text) {
        fprintf(report, "%s: cannot read\n", md);
        return 1;
    }
    int bad = 0, in_fence = 0, lineno = 0;
    for (const char *line = text; *line;) {
        size_t len = strcspn(line, "\n");
        lineno++;
        if (is_fence(line))
            in_fence = !in_fence;
        else if (!in_fence)
            bad += check_line(root, md, lineno, line, len, report, links);
        line += len + (line[len] == '\n');
    }
    free(text);
    return bad;
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The checker itself, on a made-up repository: it must flag exactly the
 * bad links, each with its line. */
static void test_checker(void **state)
{
    (void)state;
    char tmp[] = "/tmp/dx_itest_docs_XXXXXX", root[PATH_MAX], docs[PATH_MAX + 8];
    assert_non_null(mkdtemp(tmp));
    snprintf(root, sizeof root, "%s/repo", tmp);
    snprintf(docs, sizeof docs, "%s/docs", root);
    assert_int_equal(mkdir(root, 0755), 0);
    assert_int_equal(mkdir(docs, 0755), 0);
    write_file(tmp, "outside.md", "# Out\n");
    write_file(root, "docs/a.md",
               "# The P/D flow (v2)\n\n## Limits\n\n## Limits\n\n```\n# not a heading\n```\n"
               "[up](../README.md) [self](#limits-1)\n");
    write_file(root, "README.md",
               "# Top\n"
               "[a](docs/a.md) [b](docs/a.md#the-pd-flow-v2) [c](./docs/a.md#limits)\n" /* 2 */
               "[d](docs/missing.md) and [e](docs/a.md#limits-2)\n"                  /* 3 */
               "[f](../outside.md) [g](https://example.com/x) [h](mailto:a@b.c)\n"   /* 4 */
               "`[i](nope.md)` [j](docs/a.md#not-a-heading) [k](docs/)\n"            /* 5 */
               "```\n[l](nope.md)\n```\n"                                            /* 6-8 */
               "[m]: docs/gone.md\n[n](#top) [o](docs/../../repo/README.md)\n");     /* 9, 10 */
    char *out = NULL;
    size_t outn = 0;
    FILE *report = open_memstream(&out, &outn);
    int links = 0;
    int bad = check_md(root, "README.md", report, &links);
    bad += check_md(root, "docs/a.md", report, &links);
    fclose(report);
    assert_int_equal(tp_rm_rf(tmp), 0);
    static const char *const want[] = {
        "README.md:3: (docs/missing.md): no such file or folder in the repository\n",
        "README.md:3: (docs/a.md#limits-2): docs/a.md has no heading with anchor '#limits-2'\n",
        "README.md:4: (../outside.md) points outside the repository\n",
        "README.md:5: (docs/a.md#not-a-heading): docs/a.md has no heading with anchor "
        "'#not-a-heading'\n",
        "README.md:9: (docs/gone.md): no such file or folder in the repository\n",
        "README.md:10: (docs/../../repo/README.md) points outside the repository\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i])) fail_msg("report lacks\n%sreport:\n%s", want[i], out);
    if (bad != (int)(sizeof want / sizeof want[0])) fail_msg("%d bad links, want 6:\n%s", bad, out);
    assert_int_equal(links, 15); /* every link outside code, the good ones too */
    free(out);
}

/* The repository's own documents. */
static void test_repo_links(void **state)
{
    (void)state;
    glob_t g;
    assert_int_equal(access("README.md", R_OK), 0); /* run from the repository root */
    assert_int_equal(glob("docs/*.md", 0, NULL, &g), 0);
    assert_int_equal(glob("deploy/*.md", GLOB_APPEND, NULL, &g), 0);
    char *out = NULL;
    size_t outn = 0;
    FILE *report = open_memstream(&out, &outn);
    int links = 0, bad = check_md(".", "README.md", report, &links);
    for (size_t i = 0; i < g.gl_pathc; i++) bad += check_md(".", g.gl_pathv[i], report, &links);
    fclose(report);
    globfree(&g);
    if (bad) fail_msg("%d broken links:\n%s", bad, out);
    assert_true(links > 0);
    printf("%d links checked\n", links);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker),
        cmocka_unit_test(test_repo_links),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
