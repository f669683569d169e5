/* Tests of fb_forwarder: examples, then a randomized check of its invariants
 * against brute-force models of the downstream and upstream tables. */
#include "ctest.h"
#include "fb_forwarder.h"

#define MAXK 5
#define MAXSET 2048

typedef struct { unsigned char key[MAXK]; size_t len; int kind; } key_t_;
typedef struct { key_t_ k; uint64_t peer; uint32_t refs; } down_t;

static down_t down[MAXSET];
static size_t ndown;
static key_t_ up[MAXSET];
static size_t nup_;

static int key_eq(const key_t_ *a, const unsigned char *k, size_t len, int kind)
{
    return a->len == len && a->kind == kind && !memcmp(a->key, k, len);
}
static int key_matches(const key_t_ *a, const unsigned char *topic, size_t len)
{
    if (a->kind == FB_EXACT) return a->len == len && !memcmp(a->key, topic, len);
    return a->len <= len && !memcmp(a->key, topic, a->len);
}
static int down_wants(const unsigned char *t, size_t len)
{
    for (size_t i = 0; i < ndown; i++) if (key_matches(&down[i].k, t, len)) return 1;
    return 0;
}
static int up_wants(const key_t_ *u, size_t n, const unsigned char *t, size_t len)
{
    for (size_t i = 0; i < n; i++) if (key_matches(&u[i], t, len)) return 1;
    return 0;
}
static int up_find(const key_t_ *u, size_t n, const unsigned char *k, size_t len, int kind)
{
    for (size_t i = 0; i < n; i++) if (key_eq(&u[i], k, len, kind)) return (int)i;
    return -1;
}

/* Probe topics: every string over the alphabet up to MAXK + 1 bytes would be
 * 4^6; use every model key, its one-byte extensions, and random strings. */
#define NPROBE 256
static unsigned char probes[NPROBE][MAXK + 1];
static size_t probelen[NPROBE];
static const unsigned char alpha[] = { 'a', 'b', 0, 0xff };
static size_t make_probes(void)
{
    size_t n = 0;
    for (size_t i = 0; i < ndown && n + 2 < NPROBE; i++) {
        memcpy(probes[n], down[i].k.key, down[i].k.len);
        probelen[n++] = down[i].k.len;
        memcpy(probes[n], down[i].k.key, down[i].k.len);
        probes[n][down[i].k.len] = alpha[rndn(4)];
        probelen[n++] = down[i].k.len + 1;
    }
    while (n < NPROBE) {
        probelen[n] = rndn(MAXK + 2);
        for (size_t j = 0; j < probelen[n]; j++) probes[n][j] = alpha[rndn(4)];
        n++;
    }
    return n;
}

/* Apply a diff to the upstream model, checking at every step that no topic
 * wanted before and after the event is filtered out. */
static void apply_diff(const fb_keylist *d, const int *wanted_before, size_t np)
{
    for (size_t i = 0; i < d->n; i++) {
        const fb_keyent *e = &d->ents[i];
        const unsigned char *k = fb_keylist_key(d, i);
        int kind = (e->flags & FB_KL_PREFIX) ? FB_PREFIX : FB_EXACT;
        int at = up_find(up, nup_, k, e->len, kind);
        if (e->flags & FB_KL_SUBSCRIBE) {
            CHECK(at < 0);            /* never subscribe twice */
            if (at < 0 && nup_ < MAXSET) {
                memcpy(up[nup_].key, k, e->len);
                up[nup_].len = e->len;
                up[nup_].kind = kind;
                nup_++;
            }
        } else {
            CHECK(at >= 0);           /* never unsubscribe what is not there */
            if (at >= 0) up[at] = up[--nup_];
        }
        for (size_t p = 0; p < np; p++)
            if (wanted_before[p] && down_wants(probes[p], probelen[p]))
                CHECK(up_wants(up, nup_, probes[p], probelen[p]));
    }
}

/* The U that subsume (or dedup) mode should hold, uncollapsed. */
static size_t expected_u(int mode, key_t_ *out)
{
    size_t n = 0;
    for (size_t i = 0; i < ndown; i++) {
        const key_t_ *k = &down[i].k;
        if (up_find(out, n, k->key, k->len, k->kind) >= 0) continue;
        int covered = 0;
        if (mode == FB_FWD_SUBSUME)
            for (size_t j = 0; j < ndown && !covered; j++) {
                const key_t_ *c = &down[j].k;
                if (c->kind != FB_PREFIX || c->len > k->len) continue;
                if (c->len == k->len && k->kind == FB_PREFIX) continue;
                covered = !memcmp(c->key, k->key, c->len);
            }
        if (!covered) out[n++] = *k;
    }
    return n;
}

/* With a table: the forwarder works over it (fb_forwarder_new_over), and
 * the table must hold exactly the downstream model's keys. */
static void run_random_over(int mode, size_t cap, size_t cap_low, int steps, unsigned long long seed,
                            fb_trie *table, int parts)
{
    ctest_rng = seed;
    fb_forwarder *f = table ? fb_forwarder_new_over(table, mode, cap, cap_low) : fb_forwarder_new(mode, cap, cap_low);
    REQUIRE(f);
    if (table) CHECK(fb_forwarder_trie(f) == table);
    fb_keylist d, snap;
    fb_keylist_init(&d);
    fb_keylist_init(&snap);
    static key_t_ ub[MAXSET], ua[MAXSET];
    static int wanted[NPROBE];
    ndown = nup_ = 0;
    int failures0 = ctest_failures;
    int collapses = 0, expands = 0;
    for (int step = 0; step < steps; step++) {
        size_t np = make_probes();
        for (size_t p = 0; p < np; p++) wanted[p] = down_wants(probes[p], probelen[p]);
        size_t nub = expected_u(mode, ub);
        int was_collapsed = fb_forwarder_collapsed(f);
        fb_keylist_clear(&d);
        int minimal = 1;
        unsigned op = rndn(100);
        unsigned char k[MAXK];
        size_t len = rndn(MAXK + 1);
        for (size_t i = 0; i < len; i++) k[i] = alpha[rndn(4)];
        int kind = (int)rndn(2);
        uint64_t peer = rndn(4);
        if (op < 55) {
            int rc = fb_forwarder_subscribe(f, peer, k, len, kind, &d);
            CHECK(rc >= 0);
            size_t i;
            for (i = 0; i < ndown; i++) if (down[i].peer == peer && key_eq(&down[i].k, k, len, kind)) break;
            if (i < ndown) down[i].refs++;
            else if (ndown < MAXSET) {
                memcpy(down[ndown].k.key, k, len);
                down[ndown].k.len = len; down[ndown].k.kind = kind;
                down[ndown].peer = peer; down[ndown].refs = 1; ndown++;
            }
        } else if (op < 92) {
            if (ndown && rndn(4)) {
                size_t i = rndn((unsigned)ndown);
                memcpy(k, down[i].k.key, down[i].k.len); len = down[i].k.len;
                kind = down[i].k.kind; peer = down[i].peer;
            }
            size_t i;
            for (i = 0; i < ndown; i++) if (down[i].peer == peer && key_eq(&down[i].k, k, len, kind)) break;
            int rc = fb_forwarder_unsubscribe(f, peer, k, len, kind, &d);
            if (i == ndown) { CHECK_EQ(rc, FB_ENOTFOUND); CHECK_EQ(d.n, 0); }
            else { CHECK(rc >= 0); if (--down[i].refs == 0) down[i] = down[--ndown]; }
        } else {
            size_t held = 0;
            for (size_t i = 0; i < ndown; i++) held += down[i].peer == peer;
            for (size_t i = 0; i < ndown;) if (down[i].peer == peer) down[i] = down[--ndown]; else i++;
            if (parts) {
                /* A part at a time (remove_peer_some), each part's diff
                 * applied before the next is built, each op checked. */
                size_t max_bytes = 1 + rndn(3), n = 0;
                int rc;
                while ((rc = fb_forwarder_remove_peer_some(f, peer, &d, max_bytes)) == 1) {
                    apply_diff(&d, wanted, np);
                    fb_keylist_clear(&d);
                    REQUIRE(++n <= held);
                }
                CHECK_EQ(rc, 0);
                minimal = 0;
            } else {
                CHECK_EQ(fb_forwarder_remove_peer(f, peer, &d), held);
            }
        }
        apply_diff(&d, wanted, np);
        /* Upstream matches exactly when downstream does (collapsed, it
         * matches everything, by design). */
        if (!fb_forwarder_collapsed(f))
            for (size_t p = 0; p < np; p++)
                CHECK_EQ(up_wants(up, nup_, probes[p], probelen[p]), down_wants(probes[p], probelen[p]));
        size_t nua = expected_u(mode, ua);
        CHECK_EQ(fb_forwarder_upstream_count(f), nua);
        if (fb_forwarder_collapsed(f)) {
            CHECK_EQ(nup_, 1);
            CHECK(nup_ == 1 && up[0].len == 0 && up[0].kind == FB_PREFIX);
        } else {
            /* Exactly U, reached by a minimal diff when no cap was crossed. */
            CHECK_EQ(nup_, nua);
            for (size_t i = 0; i < nua; i++) CHECK(up_find(up, nup_, ua[i].key, ua[i].len, ua[i].kind) >= 0);
            if (!was_collapsed && minimal) {
                size_t sym = 0;
                for (size_t i = 0; i < nua; i++) sym += up_find(ub, nub, ua[i].key, ua[i].len, ua[i].kind) < 0;
                for (size_t i = 0; i < nub; i++) sym += up_find(ua, nua, ub[i].key, ub[i].len, ub[i].kind) < 0;
                CHECK_EQ(d.n, sym);
            }
        }
        collapses += !was_collapsed && fb_forwarder_collapsed(f);
        expands += was_collapsed && !fb_forwarder_collapsed(f);
        /* The snapshot is the upstream set. */
        fb_keylist_clear(&snap);
        CHECK_EQ(fb_forwarder_snapshot(f, &snap), FB_OK);
        CHECK_EQ(snap.n, nup_);
        for (size_t i = 0; i < snap.n; i++) {
            CHECK(snap.ents[i].flags & FB_KL_SUBSCRIBE);
            CHECK(up_find(up, nup_, fb_keylist_key(&snap, i), snap.ents[i].len,
                          (snap.ents[i].flags & FB_KL_PREFIX) ? FB_PREFIX : FB_EXACT) >= 0);
        }
        const char *why;
        CHECK_EQ(fb_trie_check(fb_forwarder_trie(f), &why), FB_OK);
        if (ctest_failures != failures0) {
            fprintf(stderr, "mode %d cap %zu: failed at step %d (op %u)\n", mode, cap, step, op);
            break;
        }
    }
    if (cap) {
        CHECK(collapses > 0);
        CHECK(expands > 0);
    }
    if (table) {
        for (size_t i = 0; i < ndown; i++)
            CHECK(fb_trie_holders(table, down[i].k.key, down[i].k.len, down[i].k.kind) > 0);
        fb_trie_stats st;
        fb_trie_get_stats(table, &st);
        CHECK_EQ(st.subscriptions, ndown);              /* nothing else: one entry per (key, kind, peer) */
    }
    fb_keylist_free(&d);
    fb_keylist_free(&snap);
    fb_forwarder_free(f);
}

static void run_random(int mode, size_t cap, size_t cap_low, int steps, unsigned long long seed)
{
    run_random_over(mode, cap, cap_low, steps, seed, NULL, 0);
}

static void test_random_subsume_over_a_table(void)
{
    /* The same walk over a table the test owns: the same diffs, the table
     * holds what the peers hold, and it outlives the forwarder. */
    fb_trie *t = fb_trie_new();
    REQUIRE(t);
    run_random_over(FB_FWD_SUBSUME, 0, 0, 6000, 12, t, 0);
    const char *why = NULL;
    CHECK_EQ(fb_trie_check(t, &why), FB_OK);
    fb_trie_free(t);
    CHECK(fb_forwarder_new_over(NULL, FB_FWD_SUBSUME, 0, 0) == NULL);
}

static void test_random_dedup(void) { run_random(FB_FWD_DEDUP, 0, 0, 6000, 11); }
static void test_random_subsume(void) { run_random(FB_FWD_SUBSUME, 0, 0, 6000, 12); }
static void test_random_dedup_cap(void) { run_random(FB_FWD_DEDUP, 12, 8, 6000, 13); }
static void test_random_subsume_cap(void) { run_random(FB_FWD_SUBSUME, 6, 3, 6000, 14); }
static void test_random_subsume_cap_nohyst(void) { run_random(FB_FWD_SUBSUME, 4, 4, 6000, 15); }
/* Peers leave a part at a time (fb_forwarder_remove_peer_some): every op
 * of every part keeps what is still wanted, and the set after is U. */
static void test_random_subsume_parts(void) { run_random_over(FB_FWD_SUBSUME, 0, 0, 6000, 16, NULL, 1); }
static void test_random_subsume_cap_parts(void) { run_random_over(FB_FWD_SUBSUME, 6, 3, 6000, 17, NULL, 1); }

static void test_article_example(void)
{
    /* Sustrik: with "A" forwarded, "AB" need not be; unsubscribing "A" must
     * send subscribe(AB) before unsubscribe(A). */
    fb_forwarder *f = fb_forwarder_new(FB_FWD_SUBSUME, 0, 0);
    fb_keylist d;
    fb_keylist_init(&d);
    CHECK_EQ(fb_forwarder_subscribe(f, 1, "A", 1, FB_PREFIX, &d), 1);
    CHECK_EQ(d.n, 1);
    fb_keylist_clear(&d);
    CHECK_EQ(fb_forwarder_subscribe(f, 2, "AB", 2, FB_PREFIX, &d), 1);
    CHECK_EQ(d.n, 0);
    CHECK_EQ(fb_forwarder_subscribe(f, 3, "A", 1, FB_PREFIX, &d), 0);   /* second holder: nothing */
    CHECK_EQ(d.n, 0);
    CHECK_EQ(fb_forwarder_remove_peer(f, 1, &d), 1);
    CHECK_EQ(d.n, 0);                                              /* peer 3 still holds A */
    CHECK_EQ(fb_forwarder_unsubscribe(f, 3, "A", 1, FB_PREFIX, &d), 1);
    REQUIRE(d.n == 2);
    CHECK(d.ents[0].flags == (FB_KL_SUBSCRIBE | FB_KL_PREFIX));
    CHECK(d.ents[0].len == 2 && !memcmp(fb_keylist_key(&d, 0), "AB", 2));
    CHECK(d.ents[1].flags == FB_KL_PREFIX);
    CHECK(d.ents[1].len == 1 && !memcmp(fb_keylist_key(&d, 1), "A", 1));
    fb_keylist_clear(&d);
    CHECK_EQ(fb_forwarder_unsubscribe(f, 3, "A", 1, FB_PREFIX, &d), FB_ENOTFOUND);
    CHECK_EQ(d.n, 0);
    fb_keylist_free(&d);
    fb_forwarder_free(f);
    CHECK(fb_forwarder_new(FB_FWD_SUBSUME, 4, 5) == NULL);   /* cap_low > cap */
    CHECK(fb_forwarder_new((fb_forwarder_mode)7, 0, 0) == NULL);
}

static void test_remove_peer_minimal(void)
{
    /* Peer 1 holds "a" and "ab"; peer 2 holds "abc".  Losing peer 1 must be
     * subscribe(abc), unsubscribe(a): nothing about "ab", which was hidden. */
    fb_forwarder *f = fb_forwarder_new(FB_FWD_SUBSUME, 0, 0);
    fb_keylist d;
    fb_keylist_init(&d);
    fb_forwarder_subscribe(f, 1, "a", 1, FB_PREFIX, &d);
    fb_forwarder_subscribe(f, 1, "ab", 2, FB_PREFIX, &d);
    fb_forwarder_subscribe(f, 2, "abc", 3, FB_EXACT, &d);
    CHECK_EQ(d.n, 1);
    fb_keylist_clear(&d);
    CHECK_EQ(fb_forwarder_remove_peer(f, 1, &d), 2);
    REQUIRE(d.n == 2);
    CHECK(d.ents[0].flags == FB_KL_SUBSCRIBE && d.ents[0].len == 3);
    CHECK(d.ents[1].flags == FB_KL_PREFIX && d.ents[1].len == 1);
    fb_keylist_free(&d);
    fb_forwarder_free(f);
}

/* How a peer leaves the second of two forwarders (held: what remove_peer
 * said it held in the first). */
typedef void (*leave_fn)(fb_forwarder *f, uint64_t peer, int held);

static void leave_by_drop(fb_forwarder *f, uint64_t peer, int held)
{
    CHECK_EQ(fb_forwarder_drop_peer(f, peer), held);
}

static void leave_in_parts(fb_forwarder *f, uint64_t peer, int held)
{
    /* A few bytes of keys a part: each part removes some, the last none. */
    fb_keylist d;
    fb_keylist_init(&d);
    size_t max_bytes = 1 + rndn(3);
    int rc, parts = 0;
    do {
        fb_keylist_clear(&d);
        rc = fb_forwarder_remove_peer_some(f, peer, &d, max_bytes);
        CHECK(rc == 0 || rc == 1);
        if (rc == 0) CHECK_EQ(d.n, 0);
        REQUIRE(parts++ <= held);
    } while (rc == 1);
    fb_keylist_free(&d);
}

/* Two forwarders fed the same events; a peer leaves the first by
 * remove_peer and the second by `leave`: the same upstream set after, the
 * same count, collapsed or not alike (with a cap and without). */
static void compare_leaving(unsigned long long seed, leave_fn leave)
{
    for (size_t cap = 0; cap <= 6; cap += 6) {
        ctest_rng = seed + cap;
        fb_forwarder *a = fb_forwarder_new(FB_FWD_SUBSUME, cap, cap / 2);
        fb_forwarder *b = fb_forwarder_new(FB_FWD_SUBSUME, cap, cap / 2);
        REQUIRE(a && b);
        fb_keylist d, sa, sb;
        fb_keylist_init(&d); fb_keylist_init(&sa); fb_keylist_init(&sb);
        for (int round = 0; round < 200; round++) {
            for (int i = 0; i < 20; i++) {
                unsigned char k[MAXK];
                size_t len = rndn(MAXK + 1);
                for (size_t j = 0; j < len; j++) k[j] = alpha[rndn(4)];
                int kind = (int)rndn(2);
                uint64_t peer = rndn(4);
                fb_keylist_clear(&d);
                CHECK(fb_forwarder_subscribe(a, peer, k, len, kind, &d) >= 0);
                CHECK(fb_forwarder_subscribe(b, peer, k, len, kind, &d) >= 0);
            }
            uint64_t gone = rndn(4);
            fb_keylist_clear(&d);
            int held = fb_forwarder_remove_peer(a, gone, &d);
            CHECK(held >= 0);
            leave(b, gone, held);
            CHECK_EQ(fb_forwarder_upstream_count(a), fb_forwarder_upstream_count(b));
            CHECK_EQ(fb_forwarder_collapsed(a), fb_forwarder_collapsed(b));
            fb_keylist_clear(&sa); fb_keylist_clear(&sb);
            CHECK_EQ(fb_forwarder_snapshot(a, &sa), FB_OK);
            CHECK_EQ(fb_forwarder_snapshot(b, &sb), FB_OK);
            REQUIRE(sa.n == sb.n && sa.nbytes == sb.nbytes);
            CHECK(sa.nbytes == 0 || !memcmp(sa.bytes, sb.bytes, sa.nbytes));
        }
        fb_keylist_free(&d); fb_keylist_free(&sa); fb_keylist_free(&sb);
        fb_forwarder_free(a);
        fb_forwarder_free(b);
    }
}

static void test_drop_peer_leaves_what_remove_peer_leaves(void)
{
    /* drop_peer builds no diff at all. */
    compare_leaving(77, leave_by_drop);
    fb_forwarder *f = fb_forwarder_new(FB_FWD_SUBSUME, 0, 0);
    CHECK_EQ(fb_forwarder_drop_peer(f, 99), 0);                  /* a peer it never saw */
    fb_forwarder_free(f);
}

static void test_remove_peer_in_parts_leaves_what_remove_peer_leaves(void)
{
    /* remove_peer_some, a part at a time (test_random_subsume_parts
     * checks every op of every part against the model). */
    compare_leaving(91, leave_in_parts);
    fb_forwarder *f = fb_forwarder_new(FB_FWD_DEDUP, 0, 0);
    fb_keylist d;
    fb_keylist_init(&d);
    CHECK_EQ(fb_forwarder_remove_peer_some(f, 1, &d, 0), FB_EINVAL);
    CHECK_EQ(fb_forwarder_remove_peer_some(f, 1, &d, 1), 0);      /* a peer it never saw */
    fb_keylist_free(&d);
    fb_forwarder_free(f);
}

int main(void)
{
    RUN(test_drop_peer_leaves_what_remove_peer_leaves);
    RUN(test_remove_peer_in_parts_leaves_what_remove_peer_leaves);
    RUN(test_article_example);
    RUN(test_remove_peer_minimal);
    RUN(test_random_dedup);
    RUN(test_random_subsume);
    RUN(test_random_subsume_over_a_table);
    RUN(test_random_dedup_cap);
    RUN(test_random_subsume_cap);
    RUN(test_random_subsume_cap_nohyst);
    RUN(test_random_subsume_parts);
    RUN(test_random_subsume_cap_parts);
    CTEST_END();
}
