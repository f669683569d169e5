/* Unit and randomized differential tests of fb_trie. */
#include "ctest.h"
#include "fb_trie.h"

static void check_ok(fb_trie *t, int line)
{
    const char *why;
    if (fb_trie_check(t, &why) != FB_OK) {
        fprintf(stderr, "line %d: invariant broken: %s\n", line, why);
        exit(1);
    }
}
#define CK(t) check_ok(t, __LINE__)

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_basics(void)
{
    fb_trie *t = fb_trie_new();
    CHECK_EQ(fb_trie_add(t, "abc", 3, FB_EXACT, 1), 1);
    CHECK_EQ(fb_trie_add(t, "abc", 3, FB_EXACT, 2), 0);
    CHECK_EQ(fb_trie_add(t, "abc", 3, FB_EXACT, 2), 0);
    CHECK_EQ(fb_trie_refcount(t, "abc", 3, FB_EXACT, 2), 2);
    CHECK_EQ(fb_trie_holders(t, "abc", 3, FB_EXACT), 2);
    CHECK_EQ(fb_trie_add(t, "abc", 3, FB_PREFIX, 2), 1);      /* other kind: a new key */
    CK(t);
    CHECK_EQ(fb_trie_remove(t, "abc", 3, FB_EXACT, 2), 0);
    CHECK_EQ(fb_trie_remove(t, "abc", 3, FB_EXACT, 2), 0);    /* subscriber 1 still holds it */
    CHECK_EQ(fb_trie_remove(t, "abc", 3, FB_EXACT, 2), FB_ENOTFOUND);
    CHECK_EQ(fb_trie_remove(t, "abc", 3, FB_EXACT, 1), 1);
    CHECK_EQ(fb_trie_remove(t, "abc", 3, FB_EXACT, 1), FB_ENOTFOUND);
    CHECK_EQ(fb_trie_remove(t, "zzz", 3, FB_EXACT, 1), FB_ENOTFOUND);
    CHECK_EQ(fb_trie_remove(t, "ab", 2, FB_PREFIX, 2), FB_ENOTFOUND);
    CHECK_EQ(fb_trie_remove(t, "abc", 3, FB_PREFIX, 77), FB_ENOTFOUND);
    CHECK_EQ(fb_trie_add(t, "x", 1, 2, 1), FB_EINVAL);
    CHECK_EQ(fb_trie_add(t, NULL, 1, FB_EXACT, 1), FB_EINVAL);
    CK(t);
    fb_trie_stats s;
    fb_trie_get_stats(t, &s);
    CHECK_EQ(s.keys, 1);
    CHECK_EQ(s.subscriptions, 1);
    CHECK_EQ(s.subscribers, 1);
    CHECK_EQ(fb_trie_remove(t, "abc", 3, FB_PREFIX, 2), 1);
    fb_trie_get_stats(t, &s);
    CHECK_EQ(s.keys, 0);
    CHECK_EQ(s.subscribers, 0);
    CHECK_EQ(s.nodes, 1);
    CK(t);
    fb_trie_free(t);
}

static void test_binary_and_empty(void)
{
    fb_trie *t = fb_trie_new();
    const char k1[] = { 'a', 0, (char)0xff, 'b' };
    const char k2[] = { 'a', 0, (char)0xff };
    fb_idvec v;
    fb_idvec_init(&v);
    CHECK_EQ(fb_trie_add(t, k1, 4, FB_EXACT, 1), 1);
    CHECK_EQ(fb_trie_add(t, k2, 3, FB_PREFIX, 2), 1);
    CHECK_EQ(fb_trie_add(t, "", 0, FB_EXACT, 3), 1);
    CK(t);
    CHECK_EQ(fb_trie_match(t, k1, 4, &v), 2);
    fb_idvec_clear(&v);
    CHECK_EQ(fb_trie_match(t, k1, 3, &v), 1);   /* the prefix matches itself */
    CHECK_EQ(v.ids[0], 2);
    fb_idvec_clear(&v);
    CHECK_EQ(fb_trie_match(t, "", 0, &v), 1);   /* exact "" matches only "" */
    CHECK_EQ(v.ids[0], 3);
    fb_idvec_clear(&v);
    CHECK_EQ(fb_trie_match(t, "a", 1, &v), 0);
    CHECK_EQ(fb_trie_add(t, "", 0, FB_PREFIX, 4), 1);  /* "" prefix matches everything */
    fb_idvec_clear(&v);
    CHECK_EQ(fb_trie_match(t, "zz", 2, &v), 1);
    CHECK_EQ(v.ids[0], 4);
    CHECK_EQ(fb_trie_any_match(t, "zz", 2), 1);
    CHECK_EQ(fb_trie_covered(t, "zz", 2, FB_EXACT), 1);
    CHECK_EQ(fb_trie_covered(t, "", 0, FB_PREFIX), 0);
    CHECK_EQ(fb_trie_covered(t, "", 0, FB_EXACT), 1);
    CK(t);
    fb_idvec_free(&v);
    fb_trie_free(t);
}

static void test_match_once_and_remove_subscriber(void)
{
    fb_trie *t = fb_trie_new();
    fb_idvec v;
    fb_idvec_init(&v);
    /* Subscriber 7 holds four keys that all match "market.NYSE.1": reported once. */
    CHECK_EQ(fb_trie_add(t, "", 0, FB_PREFIX, 7), 1);
    CHECK_EQ(fb_trie_add(t, "market.", 7, FB_PREFIX, 7), 1);
    CHECK_EQ(fb_trie_add(t, "market.NYSE.1", 13, FB_EXACT, 7), 1);
    CHECK_EQ(fb_trie_add(t, "market.NYSE.1", 13, FB_PREFIX, 7), 1);
    CHECK_EQ(fb_trie_add(t, "market.NYSE.1", 13, FB_EXACT, 8), 0);
    CHECK_EQ(fb_trie_match(t, "market.NYSE.1", 13, &v), 2);
    qsort(v.ids, v.n, sizeof v.ids[0], cmp_u64);
    CHECK_EQ(v.ids[0], 7);
    CHECK_EQ(v.ids[1], 8);
    fb_keylist gone;
    fb_keylist_init(&gone);
    CHECK_EQ(fb_trie_remove_subscriber(t, 7, &gone), 4);
    CK(t);
    /* "market.NYSE.1" exact is still held by 8: three keys lost their last holder. */
    CHECK_EQ(gone.n, 3);
    int saw_all = 0, saw_market = 0, saw_p1 = 0;
    for (size_t i = 0; i < gone.n; i++) {
        const fb_keyent *e = &gone.ents[i];
        const unsigned char *k = fb_keylist_key(&gone, i);
        CHECK(e->flags & FB_KL_PREFIX);
        if (e->len == 0) saw_all = 1;
        if (e->len == 7 && !memcmp(k, "market.", 7)) saw_market = 1;
        if (e->len == 13 && !memcmp(k, "market.NYSE.1", 13)) saw_p1 = 1;
    }
    CHECK(saw_all && saw_market && saw_p1);
    CHECK_EQ(fb_trie_remove_subscriber(t, 7, &gone), 0);   /* unknown now: a no-op */
    fb_idvec_clear(&v);
    CHECK_EQ(fb_trie_match(t, "market.NYSE.1", 13, &v), 1);
    fb_keylist_free(&gone);
    fb_idvec_free(&v);
    fb_trie_free(t);
}

static void test_huge_keys(void)
{
    /* A 1 MB key and topic, and a 3000-deep chain of nested keys: nothing
     * may recurse on input. */
    size_t L = 1u << 20;
    char *big = malloc(L);
    REQUIRE(big);
    memset(big, 'x', L);
    fb_trie *t = fb_trie_new();
    fb_idvec v;
    fb_idvec_init(&v);
    CHECK_EQ(fb_trie_add(t, big, L, FB_EXACT, 1), 1);
    big[L - 1] = 'y';
    CHECK_EQ(fb_trie_add(t, big, L, FB_PREFIX, 2), 1);
    CHECK_EQ(fb_trie_add(t, big, L / 2, FB_PREFIX, 3), 1);
    CK(t);
    CHECK_EQ(fb_trie_match(t, big, L, &v), 2);
    for (size_t i = 1; i <= 3000; i++) CHECK_EQ(fb_trie_add(t, big, i, FB_PREFIX, 4), 1);
    CK(t);
    fb_idvec_clear(&v);
    CHECK_EQ(fb_trie_match(t, big, L, &v), 3);
    fb_keylist gone;
    fb_keylist_init(&gone);
    CHECK_EQ(fb_trie_remove_subscriber(t, 4, &gone), 3000);
    CHECK_EQ(gone.n, 3000);
    CK(t);
    CHECK_EQ(fb_trie_remove_subscriber(t, 1, NULL), 1);
    CHECK_EQ(fb_trie_remove_subscriber(t, 2, NULL), 1);
    CHECK_EQ(fb_trie_remove_subscriber(t, 3, NULL), 1);
    fb_trie_stats s;
    fb_trie_get_stats(t, &s);
    CHECK_EQ(s.nodes, 1);
    CK(t);
    fb_keylist_free(&gone);
    fb_idvec_free(&v);
    fb_trie_free(t);
    free(big);
}

/* ---- walk ---- */
typedef struct { fb_keylist out; int skip_at_b; } walk_ctx;
static int walk_cb(void *vc, const unsigned char *k, size_t len, uint32_t ex, uint32_t px)
{
    walk_ctx *c = vc;
    fb_keylist_push(&c->out, px ? FB_KL_PREFIX : 0, ex + px, k, len);
    if (c->skip_at_b && len == 1 && k[0] == 'b') return FB_WALK_SKIP;
    return FB_WALK_NEXT;
}

static void test_walk(void)
{
    fb_trie *t = fb_trie_new();
    const char *keys[] = { "b", "a", "ba", "bb", "c", "abc", "ab" };
    for (int i = 0; i < 7; i++) fb_trie_add(t, keys[i], strlen(keys[i]), FB_EXACT, (uint64_t)i);
    fb_trie_add(t, "b", 1, FB_PREFIX, 9);
    walk_ctx c;
    fb_keylist_init(&c.out);
    c.skip_at_b = 0;
    CHECK_EQ(fb_trie_walk(t, NULL, 0, walk_cb, &c), FB_OK);
    const char *order[] = { "a", "ab", "abc", "b", "ba", "bb", "c" };
    CHECK_EQ(c.out.n, 7);
    for (size_t i = 0; i < c.out.n && i < 7; i++) {
        CHECK_EQ(c.out.ents[i].len, strlen(order[i]));
        CHECK(!memcmp(fb_keylist_key(&c.out, i), order[i], c.out.ents[i].len));
    }
    CHECK_EQ(c.out.ents[3].count, 2);   /* "b": one exact + one prefix holder */
    fb_keylist_clear(&c.out);
    c.skip_at_b = 1;
    fb_trie_walk(t, NULL, 0, walk_cb, &c);
    CHECK_EQ(c.out.n, 5);               /* ba, bb skipped */
    fb_keylist_clear(&c.out);
    c.skip_at_b = 0;
    fb_trie_walk(t, "ab", 2, walk_cb, &c);
    CHECK_EQ(c.out.n, 2);
    fb_keylist_clear(&c.out);
    fb_trie_walk(t, "abcd", 4, walk_cb, &c);
    CHECK_EQ(c.out.n, 0);
    /* A prefix that ends inside a compressed segment. */
    fb_trie_add(t, "xylophone", 9, FB_EXACT, 1);
    fb_keylist_clear(&c.out);
    fb_trie_walk(t, "xyl", 3, walk_cb, &c);
    CHECK_EQ(c.out.n, 1);
    fb_keylist_clear(&c.out);
    CHECK_EQ(fb_trie_subscriber_keys(t, 1, &c.out), FB_OK);
    CHECK_EQ(c.out.n, 2);
    fb_keylist_free(&c.out);
    fb_trie_free(t);
}

/* ---- randomized differential test against a brute-force model ---- */
#define MAXK 6
#define MODEL_MAX 4096
typedef struct { unsigned char key[MAXK]; size_t len; int kind; uint64_t sub; uint32_t refs; } mrec;
static mrec model[MODEL_MAX];
static size_t nmodel;

static int mfind(const unsigned char *k, size_t len, int kind, uint64_t sub)
{
    for (size_t i = 0; i < nmodel; i++)
        if (model[i].len == len && model[i].kind == kind && model[i].sub == sub && !memcmp(model[i].key, k, len))
            return (int)i;
    return -1;
}
static size_t mholders(const unsigned char *k, size_t len, int kind)
{
    size_t c = 0;
    for (size_t i = 0; i < nmodel; i++)
        if (model[i].len == len && model[i].kind == kind && !memcmp(model[i].key, k, len)) c++;
    return c;
}
static void mdel(size_t i) { model[i] = model[--nmodel]; }

static void rand_key(unsigned char *k, size_t *len)
{
    static const unsigned char alpha[] = { 'a', 'b', 0, 0xff };
    *len = rndn(MAXK + 1);
    for (size_t i = 0; i < *len; i++) k[i] = alpha[rndn(4)];
}

static void test_random_vs_model(void)
{
    fb_trie *t = fb_trie_new();
    fb_idvec v;
    fb_idvec_init(&v);
    fb_keylist gone;
    fb_keylist_init(&gone);
    nmodel = 0;
    int failures0 = ctest_failures;
    for (int step = 0; step < 40000; step++) {
        unsigned char k[MAXK];
        size_t len;
        rand_key(k, &len);
        int kind = (int)rndn(2);
        uint64_t sub = rndn(8) * 0x100000001ull;  /* ids far from slot numbers */
        unsigned op = rndn(100);
        if (op < 45) {
            int i = mfind(k, len, kind, sub);
            int first = mholders(k, len, kind) == 0;
            CHECK_EQ(fb_trie_add(t, k, len, kind, sub), first);
            if (i >= 0) model[i].refs++;
            else if (nmodel < MODEL_MAX) {
                memcpy(model[nmodel].key, k, len);
                model[nmodel].len = len; model[nmodel].kind = kind;
                model[nmodel].sub = sub; model[nmodel].refs = 1;
                nmodel++;
            }
        } else if (op < 80) {
            int i = mfind(k, len, kind, sub);
            if (i < 0 && nmodel && rndn(2)) { /* remove something that exists */
                i = (int)rndn((unsigned)nmodel);
                memcpy(k, model[i].key, model[i].len); len = model[i].len;
                kind = model[i].kind; sub = model[i].sub;
            }
            int rc = fb_trie_remove(t, k, len, kind, sub);
            if (i < 0) { CHECK_EQ(rc, FB_ENOTFOUND); }
            else {
                int last = model[i].refs == 1 && mholders(k, len, kind) == 1;
                CHECK_EQ(rc, last);
                if (--model[i].refs == 0) mdel((size_t)i);
            }
        } else if (op < 85) {
            size_t held = 0, lastcount = 0;
            for (size_t i = 0; i < nmodel; i++)
                if (model[i].sub == sub) {
                    held++;
                    if (mholders(model[i].key, model[i].len, model[i].kind) == 1) lastcount++;
                }
            fb_keylist_clear(&gone);
            CHECK_EQ(fb_trie_remove_subscriber(t, sub, &gone), held);
            CHECK_EQ(gone.n, lastcount);
            for (size_t i = 0; i < nmodel;) if (model[i].sub == sub) mdel(i); else i++;
        } else {
            fb_idvec_clear(&v);
            int n = fb_trie_match(t, k, len, &v);
            uint64_t want[8];
            size_t nw = 0;
            for (size_t i = 0; i < nmodel; i++) {
                const mrec *m = &model[i];
                int hit = m->kind == FB_EXACT ? (m->len == len && !memcmp(m->key, k, len))
                                              : (m->len <= len && !memcmp(m->key, k, m->len));
                if (!hit) continue;
                int dup = 0;
                for (size_t j = 0; j < nw; j++) dup |= want[j] == m->sub;
                if (!dup) want[nw++] = m->sub;
            }
            CHECK_EQ(n, nw);
            CHECK_EQ(fb_trie_any_match(t, k, len), nw > 0);
            if (nw) qsort(want, nw, sizeof want[0], cmp_u64);
            if (v.n) qsort(v.ids, v.n, sizeof v.ids[0], cmp_u64);
            for (size_t i = 0; i < nw && i < v.n; i++) CHECK_EQ(v.ids[i], want[i]);
        }
        if (step % 16 == 0) CK(t);
        if (ctest_failures != failures0) { fprintf(stderr, "failed at step %d\n", step); break; }
    }
    CK(t);
    fb_trie_stats s;
    fb_trie_get_stats(t, &s);
    CHECK_EQ(s.subscriptions, nmodel);
    fb_keylist_free(&gone);
    fb_idvec_free(&v);
    fb_trie_free(t);
}

static void test_many_holders(void)
{
    /* One key held by 5000 subscribers; remove in a scattered order. */
    fb_trie *t = fb_trie_new();
    fb_idvec v;
    fb_idvec_init(&v);
    for (uint64_t s = 0; s < 5000; s++) CHECK_EQ(fb_trie_add(t, "news", 4, FB_PREFIX, s), s == 0);
    for (uint64_t s = 0; s < 5000; s += 3) fb_trie_add(t, "news.x", 6, FB_EXACT, s);
    CK(t);
    CHECK_EQ(fb_trie_match(t, "news.x", 6, &v), 5000);
    for (uint64_t s = 0; s < 5000; s++) {
        uint64_t id = (s * 7919) % 5000;
        int rc = fb_trie_remove(t, "news", 4, FB_PREFIX, id);
        CHECK_EQ(rc, s == 4999);
        if (s % 500 == 0) CK(t);
    }
    CK(t);
    fb_trie_stats st;
    fb_trie_get_stats(t, &st);
    CHECK_EQ(st.subscribers, 1667);
    CHECK_EQ(st.keys, 1);
    fb_idvec_free(&v);
    fb_trie_free(t);
}

static void test_batch_match(void)
{
    fb_trie *t = fb_trie_new();
    fb_trie_add(t, "a", 1, FB_PREFIX, 1);
    fb_trie_add(t, "ab", 2, FB_EXACT, 2);
    fb_span topics[3] = { { (const unsigned char *)"ab", 2 }, { (const unsigned char *)"b", 1 },
                          { (const unsigned char *)"a", 1 } };
    size_t off[4];
    fb_idvec v;
    fb_idvec_init(&v);
    CHECK_EQ(fb_trie_match_batch(t, topics, 3, off, &v), FB_OK);
    CHECK_EQ(off[0], 0);
    CHECK_EQ(off[1], 2);
    CHECK_EQ(off[2], 2);
    CHECK_EQ(off[3], 3);
    CHECK_EQ(v.ids[2], 1);
    /* An empty batch, before the scratch buffer exists on a fresh trie. */
    fb_trie *t2 = fb_trie_new();
    CHECK_EQ(fb_trie_match_batch(t2, NULL, 0, off, &v), FB_OK);
    CHECK_EQ(off[0], v.n);
    fb_trie_free(t2);
    fb_idvec_free(&v);
    fb_trie_free(t);
}

static void test_batch_match_large_trie(void)
{
    /* Big enough for the interleaved (lane) path; compared with match_one.
     * Some topics match more nodes than a lane records (the fallback). */
    fb_trie *t = fb_trie_new();
    char key[64];
    for (int i = 0; i < 30000; i++) {
        int len = snprintf(key, sizeof key, "m.%c%c.%05u.%c", 'a' + (int)rndn(8), 'a' + (int)rndn(8),
                           rndn(100000), 'x' + (int)rndn(3));
        fb_trie_add(t, key, (size_t)len, (int)rndn(2), rndn(500));
    }
    for (int i = 1; i <= 12; i++) fb_trie_add(t, "m.aa.00001.x", (size_t)i, FB_PREFIX, 900 + (uint64_t)i);
    fb_trie_stats st;
    fb_trie_get_stats(t, &st);
    CHECK(st.nodes > 4096);
    enum { NT = 3000 };
    static char tbuf[NT][64];
    static fb_span spans[NT];
    static size_t off[NT + 1];
    for (int i = 0; i < NT; i++) {
        int len = i % 50 == 0 ? snprintf(tbuf[i], 64, "m.aa.00001.x")
                              : snprintf(tbuf[i], 64, "m.%c%c.%05u.%c", 'a' + (int)rndn(8), 'a' + (int)rndn(8),
                                         rndn(100000), 'x' + (int)rndn(3));
        spans[i].ptr = (const unsigned char *)tbuf[i];
        spans[i].len = (size_t)len;
    }
    fb_idvec batch, one;
    fb_idvec_init(&batch);
    fb_idvec_init(&one);
    CHECK_EQ(fb_trie_match_batch(t, spans, NT, off, &batch), FB_OK);
    for (int i = 0; i < NT; i++) {
        fb_idvec_clear(&one);
        fb_trie_match(t, spans[i].ptr, spans[i].len, &one);
        size_t nb = off[i + 1] - off[i];
        CHECK_EQ(nb, one.n);
        if (nb != one.n) break;
        uint64_t *a = batch.ids + off[i];
        if (nb) qsort(a, nb, sizeof *a, cmp_u64);
        if (one.n) qsort(one.ids, one.n, sizeof *one.ids, cmp_u64);
        for (size_t j = 0; j < nb; j++) CHECK_EQ(a[j], one.ids[j]);
    }
    fb_idvec_free(&batch);
    fb_idvec_free(&one);
    fb_trie_free(t);
}


/* A subscriber with many keys leaves: the arena gives its segments back, the
 * rest of the table is untouched; refilled, the trimmed indexes are reused. */
static void test_trim_after_big_subscriber_leaves(void)
{
    fb_trie *t = fb_trie_new();
    char k[64];
    for (int i = 0; i < 100; i++) {
        int n = snprintf(k, sizeof k, "keep.%d", i);
        CHECK_EQ(fb_trie_add(t, k, (size_t)n, FB_EXACT, 1), 1);
    }
    CHECK_EQ(fb_trie_add(t, "market.", 7, FB_PREFIX, 1), 1);
    fb_trie_stats small, full, after;
    fb_trie_get_stats(t, &small);
    enum { N = 300000 };
    for (int round = 0; round < 2; round++) {
        uint64_t big = 2 + (uint64_t)round;
        for (int i = 0; i < N; i++) {
            int n = snprintf(k, sizeof k, "market.%s.%07d.trades", i % 2 ? "NYSE" : "LSE", i);
            REQUIRE(fb_trie_add(t, k, (size_t)n, FB_EXACT, big) == 1);
        }
        fb_trie_get_stats(t, &full);
        CHECK(full.bytes_reserved > 10u << 20);
        if (round == 0) {
            CHECK_EQ(fb_trie_remove_subscriber(t, big, NULL), N);
        } else {
            /* Key by key, in a scattered order (i * 7919 mod N visits all). */
            for (long j = 0; j < N; j++) {
                long i = (j * 7919) % N;
                int n = snprintf(k, sizeof k, "market.%s.%07ld.trades", i % 2 ? "NYSE" : "LSE", i);
                REQUIRE(fb_trie_remove(t, k, (size_t)n, FB_EXACT, big) == 1);
                if (j % 50000 == 0) CK(t);
            }
        }
        CK(t);
        fb_trie_get_stats(t, &after);
        CHECK_EQ(after.subscriptions, 101);
        /* What is left: segment 0, the segments the survivors' nodes sit in
         * (a handful), slot and hash tables. */
        CHECK(after.bytes_reserved < small.bytes_reserved + (6u << 20));
        CHECK(after.bytes_reserved * 4 < full.bytes_reserved);
        fb_idvec v;
        fb_idvec_init(&v);
        CHECK_EQ(fb_trie_match(t, "keep.42", 7, &v), 1);
        CHECK_EQ(fb_trie_match(t, "market.LSE.0000002.trades", 25, &v), 1);  /* the prefix */
        fb_idvec_free(&v);
    }
    fb_trie_free(t);
}

/* Bulk subscribe/unsubscribe of key ranges by 8 subscribers over shared
 * keys, against a bitmap model: segments empty out and are trimmed while
 * other subscribers' keys stay, and refill.  fb_trie_check (with its arena
 * audit) after every operation. */
#define BK_N 30000
#define BK_SUBS 8
static unsigned char bk_held[BK_SUBS][BK_N];

static int bk_key(char *k, unsigned id) { return snprintf(k, 32, "t.%c.%05u", 'a' + (int)(id % 7), id); }

static unsigned bk_holders(unsigned id)
{
    unsigned n = 0;
    for (int s = 0; s < BK_SUBS; s++) n += bk_held[s][id];
    return n;
}

static void test_bulk_ranges_vs_model(void)
{
    fb_trie *t = fb_trie_new();
    memset(bk_held, 0, sizeof bk_held);
    fb_idvec v;
    fb_idvec_init(&v);
    char k[32];
    size_t peak = 0;
    for (int step = 0; step < 160; step++) {
        unsigned s = rndn(BK_SUBS), a = rndn(BK_N), len = 1 + rndn(BK_N / 2);
        unsigned b = a + len > BK_N ? BK_N : a + len;
        unsigned op = rndn(10);
        if (op < 5) {
            for (unsigned id = a; id < b; id++) {
                if (bk_held[s][id]) continue;
                int n = bk_key(k, id);
                CHECK_EQ(fb_trie_add(t, k, (size_t)n, FB_EXACT, s), bk_holders(id) == 0);
                bk_held[s][id] = 1;
            }
        } else if (op < 8) {
            for (unsigned id = a; id < b; id++) {
                if (!bk_held[s][id]) continue;
                int n = bk_key(k, id);
                CHECK_EQ(fb_trie_remove(t, k, (size_t)n, FB_EXACT, s), bk_holders(id) == 1);
                bk_held[s][id] = 0;
            }
        } else {
            size_t held = 0;
            for (unsigned id = 0; id < BK_N; id++) held += bk_held[s][id];
            CHECK_EQ(fb_trie_remove_subscriber(t, s, NULL), held);
            for (unsigned id = 0; id < BK_N; id++) bk_held[s][id] = 0;
        }
        CK(t);
        fb_trie_stats st;
        fb_trie_get_stats(t, &st);
        if (st.bytes_reserved > peak) peak = st.bytes_reserved;
        for (int j = 0; j < 50; j++) {
            unsigned id = rndn(BK_N);
            int n = bk_key(k, id);
            fb_idvec_clear(&v);
            CHECK_EQ(fb_trie_match(t, k, (size_t)n, &v), bk_holders(id));
            for (size_t i = 0; i < v.n; i++) CHECK(v.ids[i] < BK_SUBS && bk_held[v.ids[i]][id]);
        }
    }
    for (uint64_t s = 0; s < BK_SUBS; s++) fb_trie_remove_subscriber(t, s, NULL);
    CK(t);
    fb_trie_stats st;
    fb_trie_get_stats(t, &st);
    CHECK_EQ(st.nodes, 1);
    /* Only the root is left: segment 0 and the segment it sits in. */
    CHECK(peak > 4u << 20);
    CHECK(st.bytes_reserved < (2u << 20) + (64u << 10));
    fb_idvec_free(&v);
    fb_trie_free(t);
}

int main(void)
{
    RUN(test_basics);
    RUN(test_binary_and_empty);
    RUN(test_match_once_and_remove_subscriber);
    RUN(test_huge_keys);
    RUN(test_walk);
    RUN(test_random_vs_model);
    RUN(test_many_holders);
    RUN(test_batch_match);
    RUN(test_batch_match_large_trie);
    RUN(test_trim_after_big_subscriber_leaves);
    RUN(test_bulk_ranges_vs_model);
    CTEST_END();
}
