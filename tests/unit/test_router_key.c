/* test_router_key: conversation keys — namespaces keep tenants apart (an
 * absent Authorization is its own namespace, distinct from an empty one; an
 * API key's digest, a header and the internal key never share one; the
 * secret changes every namespace), the nodes' cache salts follow them,
 * ids and content keys never meet, the running content hash gives one key
 * per prefix and the stored "messages + reply" key is exactly the prefix the
 * next turn resends, field boundaries cannot be shifted, and the seed
 * changes every key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "router/router_key.h"

#define SEED 0x1234567890abcdefull

static const uint8_t k_secret[ROUTER_KEY_SECRET] = "a 32-byte secret for the tests!";

typedef struct {
    const char *role, *content;
} msg;

static router_key ns_of(const char *auth)
{
    router_key ns;
    router_key_ns(k_secret, auth ? ROUTER_TENANT_HEADER : ROUTER_TENANT_NONE, auth,
                  auth ? strlen(auth) : 0, &ns);
    return ns;
}

/* The content key of msgs[0..n) under auth, for model "m". */
static router_key chat_key(const char *auth, const msg *msgs, size_t n)
{
    router_key ns = ns_of(auth), k;
    router_key_chat_begin(SEED, &ns, "m", 1, &k);
    for (size_t i = 0; i < n; i++)
        router_key_chat_add(SEED, &k, msgs[i].role, msgs[i].content, strlen(msgs[i].content));
    return k;
}

static router_key id_key(const char *auth, const char *id)
{
    router_key ns = ns_of(auth), k;
    router_key_id(SEED, &ns, id, strlen(id), &k);
    return k;
}

static void test_namespaces(void **state)
{
    (void)state;
    router_key a = ns_of("Bearer a"), a2 = ns_of("Bearer a"), b = ns_of("Bearer b");
    router_key none = ns_of(NULL), empty = ns_of("");
    assert_true(router_key_eq(&a, &a2));
    assert_false(router_key_eq(&a, &b));
    assert_false(router_key_eq(&none, &empty));
    /* the same conversation id in two namespaces: two keys */
    router_key ka = id_key("Bearer a", "conv-1"), kb = id_key("Bearer b", "conv-1");
    router_key kn = id_key(NULL, "conv-1");
    assert_false(router_key_eq(&ka, &kb));
    assert_false(router_key_eq(&ka, &kn));
    router_key ka2 = id_key("Bearer a", "conv-1"), ka3 = id_key("Bearer a", "conv-2");
    assert_true(router_key_eq(&ka, &ka2));
    assert_false(router_key_eq(&ka, &ka3));
    /* content keys too */
    msg m[] = {{"user", "hello"}};
    router_key ca = chat_key("Bearer a", m, 1), cb = chat_key("Bearer b", m, 1);
    assert_false(router_key_eq(&ca, &cb));
}

static void test_prefix_chain(void **state)
{
    (void)state;
    msg turn2[] = {
        {"system", "be brief"}, {"user", "hi"}, {"assistant", "hello there"}, {"user", "and now?"}};
    /* turn 1 finished: stored under its messages + the reply as received */
    router_key stored = chat_key(NULL, turn2, 2);
    router_key_chat_add(SEED, &stored, "assistant", "hello there", 11);
    /* turn 2 resends history + reply + a new message: its prefix of 3 is
     * the stored key, and no other prefix is */
    router_key p[5];
    for (size_t k = 1; k <= 4; k++) p[k] = chat_key(NULL, turn2, k);
    assert_true(router_key_eq(&p[3], &stored));
    assert_false(router_key_eq(&p[2], &stored));
    assert_false(router_key_eq(&p[4], &stored));
    /* a reply edited by the client is a different prefix */
    msg edited[] = {{"system", "be brief"}, {"user", "hi"}, {"assistant", "hello there!"}};
    router_key e = chat_key(NULL, edited, 3);
    assert_false(router_key_eq(&e, &stored));
    /* the model name is part of the key */
    router_key ns = ns_of(NULL), other;
    router_key_chat_begin(SEED, &ns, "m2", 2, &other);
    router_key first = chat_key(NULL, turn2, 0);
    assert_false(router_key_eq(&other, &first));
}

static void test_boundaries(void **state)
{
    (void)state;
    /* content moved between messages, or between role and content */
    msg a[] = {{"user", "ab"}, {"user", "c"}}, b[] = {{"user", "a"}, {"user", "bc"}};
    router_key ka = chat_key(NULL, a, 2), kb = chat_key(NULL, b, 2);
    assert_false(router_key_eq(&ka, &kb));
    msg c[] = {{"user", "x"}}, d[] = {{"tool", "x"}};
    router_key kc = chat_key(NULL, c, 1), kd = chat_key(NULL, d, 1);
    assert_false(router_key_eq(&kc, &kd));
    /* an empty message still counts */
    msg e1[] = {{"user", "x"}}, e2[] = {{"user", "x"}, {"assistant", ""}};
    router_key k1 = chat_key(NULL, e1, 1), k2 = chat_key(NULL, e2, 2);
    assert_false(router_key_eq(&k1, &k2));
    /* an id never equals a content key */
    router_key ns = ns_of(NULL), cid;
    router_key_chat_begin(SEED, &ns, "m", 1, &cid);
    router_key iid = id_key(NULL, "m");
    assert_false(router_key_eq(&cid, &iid));
    /* a long role is hashed, not truncated */
    char r1[80], r2[80];
    memset(r1, 'r', sizeof r1 - 1);
    r1[79] = 0;
    memcpy(r2, r1, sizeof r2);
    r2[78] = 's';
    msg l1[] = {{r1, "x"}}, l2[] = {{r2, "x"}};
    router_key kl1 = chat_key(NULL, l1, 1), kl2 = chat_key(NULL, l2, 1);
    assert_false(router_key_eq(&kl1, &kl2));
}

static void test_seed(void **state)
{
    (void)state;
    router_key ns1, ns2, k1, k2;
    uint8_t other[ROUTER_KEY_SECRET];
    memcpy(other, k_secret, sizeof other);
    other[31] ^= 1;
    router_key_ns(k_secret, ROUTER_TENANT_NONE, NULL, 0, &ns1);
    router_key_ns(other, ROUTER_TENANT_NONE, NULL, 0, &ns2);
    assert_false(router_key_eq(&ns1, &ns2));
    router_key_id(1, &ns1, "c", 1, &k1);
    router_key_id(2, &ns1, "c", 1, &k2);
    assert_false(router_key_eq(&k1, &k2));
}

/* The kinds of tenant never meet, even over the same bytes. */
static void test_tenant_kinds(void **state)
{
    (void)state;
    static const uint8_t d[32] = "a key digest, 32 bytes of it....";
    router_key key, hdr, in1, in2, none;
    router_key_ns(k_secret, ROUTER_TENANT_KEY, d, sizeof d, &key);
    router_key_ns(k_secret, ROUTER_TENANT_HEADER, d, sizeof d, &hdr);
    router_key_ns(k_secret, ROUTER_TENANT_INTERNAL, NULL, 0, &in1);
    router_key_ns(k_secret, ROUTER_TENANT_INTERNAL, d, sizeof d, &in2); /* id unused */
    router_key_ns(k_secret, ROUTER_TENANT_NONE, NULL, 0, &none);
    assert_false(router_key_eq(&key, &hdr));
    assert_true(router_key_eq(&in1, &in2));
    assert_false(router_key_eq(&in1, &none));
    assert_false(router_key_eq(&key, &none));
}

/* Cache salts: one per namespace and client salt, stable, hex. */
static void test_salts(void **state)
{
    (void)state;
    router_key a = ns_of("Bearer a"), b = ns_of("Bearer b");
    char sa[33], sa2[33], sb[33], sx[33];
    router_key_salt(k_secret, &a, "", 0, sa);
    router_key_salt(k_secret, &a, "", 0, sa2);
    router_key_salt(k_secret, &b, "", 0, sb);
    router_key_salt(k_secret, &a, "x", 1, sx);
    assert_string_equal(sa, sa2);
    assert_string_not_equal(sa, sb);
    assert_string_not_equal(sa, sx);
    assert_int_equal(strlen(sa), 32);
    assert_int_equal(strspn(sa, "0123456789abcdef"), 32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_namespaces),   cmocka_unit_test(test_prefix_chain),
        cmocka_unit_test(test_boundaries),   cmocka_unit_test(test_seed),
        cmocka_unit_test(test_tenant_kinds), cmocka_unit_test(test_salts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
