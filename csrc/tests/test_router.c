/* Tests of fb_router: routing batches into per-link outboxes.
 *
 * (Over 700 lines because it covers each of the router's parts against the
 * one delivery function.)
 */
#include "ctest.h"
#include "fb_router.h"

static unsigned char *batch_of(const char **topics, int n, size_t *len)
{
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    for (int i = 0; i < n; i++) {
        char payload[16];
        int pl = snprintf(payload, sizeof payload, "m%d", i);
        REQUIRE(fb_outbox_append(&o, topics[i], strlen(topics[i]), payload, (size_t)pl, 0) >= 0);
    }
    unsigned char *b;
    REQUIRE(fb_outbox_take(&o, &b, len) == FB_OK);
    return b;
}

static size_t take_records(fb_router *r, uint32_t link, fb_record *recs, unsigned char **keep)
{
    size_t len, n = 0;
    fb_outbox *ob = fb_router_outbox(r, link);
    REQUIRE(ob);
    REQUIRE(fb_outbox_take(ob, keep, &len) == FB_OK);
    if (!*keep) return 0;
    REQUIRE(fb_batch_decode(*keep, len, NULL, recs, 64, &n) == FB_OK);
    return n;
}

static void test_route_and_split_horizon(void)
{
    fb_trie *t = fb_trie_new();
    fb_outbox_limits lim = { 0, 0, 1000, 0 };
    fb_router *r = fb_router_new(&lim);
    for (uint32_t l = 1; l <= 3; l++) CHECK_EQ(fb_router_add_link(r, l), FB_OK);
    fb_trie_add(t, "a", 1, FB_EXACT, 1);
    fb_trie_add(t, "a", 1, FB_PREFIX, 2);       /* also matches "ab" */
    fb_trie_add(t, "", 0, FB_PREFIX, 3);        /* link 3 wants everything */
    fb_trie_add(t, "z", 1, FB_EXACT, 9);        /* link 9 has no outbox */
    const char *topics[] = { "a", "ab", "z", "a" };
    size_t len;
    unsigned char *b = batch_of(topics, 4, &len);
    /* From link 3: nothing goes back to it. */
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 3, 100), 4);
    fb_record recs[64];
    unsigned char *keep;
    size_t n = take_records(r, 1, recs, &keep);
    CHECK_EQ(n, 2);                               /* "a" twice, in order */
    CHECK(n == 2 && recs[0].payload[1] == '0' && recs[1].payload[1] == '3');
    fb_free(keep);
    n = take_records(r, 2, recs, &keep);
    CHECK_EQ(n, 3);                               /* "a", "ab", "a" */
    fb_free(keep);
    n = take_records(r, 3, recs, &keep);
    CHECK_EQ(n, 0);                               /* split horizon */
    fb_router_stats st;
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.records, 4);
    CHECK_EQ(st.deliveries, 5);
    CHECK_EQ(st.unrouted, 1);                     /* "z": only link 9, which has no outbox */
    /* Same batch from nowhere: link 3 gets all four. */
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, UINT64_MAX, 100), 4);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 3)), 4);
    fb_free(b);
    fb_router_free(r);
    fb_trie_free(t);
}

static void take_and_free(fb_router *r, uint32_t link, uint64_t now_ns)
{
    unsigned char *keep;
    size_t len;
    CHECK_EQ(fb_router_take(r, link, now_ns, &keep, &len), FB_OK);
    CHECK(keep != NULL);
    fb_free(keep);
}

/* No linger: whatever an outbox holds is due at the end of the turn. */
static void test_no_linger_everything_due(void)
{
    fb_trie *t = fb_trie_new();
    fb_outbox_limits lim = { 100, 0, 0, 0 };
    fb_router *r = fb_router_new(&lim);
    fb_router_add_link(r, 5);
    fb_router_add_link(r, 6);
    fb_trie_add(t, "x", 1, FB_EXACT, 5);
    fb_trie_add(t, "y", 1, FB_EXACT, 6);
    const char *one[] = { "x" };
    const char *two[] = { "y", "y" };
    size_t l1, l2;
    unsigned char *b1 = batch_of(one, 1, &l1), *b2 = batch_of(two, 2, &l2);
    uint32_t due[8];
    CHECK_EQ(fb_router_deadline(r), UINT64_MAX);
    CHECK_EQ(fb_router_due(r, 0, due, 8), 0);
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 100);
    fb_router_route(r, t, b2, l2, NULL, UINT64_MAX, 100);
    CHECK_EQ(fb_router_deadline(r), 0);              /* due now */
    CHECK_EQ(fb_router_due(r, 100, due, 8), 2);
    take_and_free(r, 5, 100);
    take_and_free(r, 6, 100);
    CHECK_EQ(fb_router_deadline(r), UINT64_MAX);
    /* A link just sent to is due again at once: no linger. */
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 101);
    CHECK_EQ(fb_router_due(r, 101, due, 8), 1);
    CHECK_EQ(due[0], 5);
    CHECK_EQ(fb_router_pending(r, due, 1), 1);       /* a cap is honoured */
    CHECK_EQ(fb_router_remove_link(r, 5), 1);
    CHECK(fb_router_outbox(r, 5) == NULL && !fb_router_has_link(r, 5));
    CHECK_EQ(fb_router_due(r, 101, due, 8), 0);
    CHECK_EQ(fb_router_deadline(r), UINT64_MAX);
    unsigned char *keep = (unsigned char *)1;
    size_t len = 1;
    CHECK_EQ(fb_router_take(r, 5, 0, &keep, &len), FB_OK);   /* unknown link: nothing */
    CHECK(keep == NULL && len == 0);
    CHECK_EQ(fb_router_add_link(r, 0x80000000u), FB_EINVAL);
    fb_free(b1);
    fb_free(b2);
    fb_router_free(r);
    fb_trie_free(t);
}

/* A linger L: an idle link sends at once; a busy one at most once per L
 * (or when full). */
static void test_linger(void)
{
    fb_trie *t = fb_trie_new();
    fb_outbox_limits lim = { 3, 0, 1000, 0 };    /* linger 1000 ns */
    fb_router *r = fb_router_new(&lim);
    fb_router_add_link(r, 1);
    fb_router_add_link(r, 2);
    fb_trie_add(t, "x", 1, FB_EXACT, 1);
    fb_trie_add(t, "y", 1, FB_EXACT, 2);
    const char *one[] = { "x" };
    const char *three[] = { "y", "y", "y" };
    size_t l1, l3;
    unsigned char *b1 = batch_of(one, 1, &l1), *b3 = batch_of(three, 3, &l3);
    uint32_t due[8];
    /* Never sent to: idle, due at once, whatever the clock says. */
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 5);
    CHECK_EQ(fb_router_deadline(r), 0);
    CHECK_EQ(fb_router_due(r, 5, due, 8), 1);
    take_and_free(r, 1, 10);                       /* sent at 10 */
    /* The next message within the linger waits until 10 + 1000. */
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 20);
    CHECK_EQ(fb_router_due(r, 20, due, 8), 0);
    CHECK_EQ(fb_router_deadline(r), 1010);
    CHECK_EQ(fb_router_due(r, 1009, due, 8), 0);
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 500);   /* joins the same batch */
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 1)), 2);
    CHECK_EQ(fb_router_due(r, 1010, due, 8), 1);
    CHECK_EQ(due[0], 1);
    take_and_free(r, 1, 1010);
    /* Idle for longer than the linger: a lone message goes at once. */
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 5000);
    CHECK_EQ(fb_router_deadline(r), 2010);          /* already past */
    CHECK_EQ(fb_router_due(r, 5000, due, 8), 1);
    take_and_free(r, 1, 5000);
    /* Full goes at once, linger or not, and is listed once by full(). */
    unsigned char *none;
    size_t nlen;
    CHECK_EQ(fb_router_take(r, 1, 5500, &none, &nlen), FB_OK);   /* empty: nothing taken, */
    CHECK(none == NULL && nlen == 0);                            /* no time recorded */
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 5001);
    CHECK_EQ(fb_router_full(r, due, 8), 0);
    fb_router_route(r, t, b3, l3, NULL, UINT64_MAX, 5001);  /* link 2: 3 = max_messages */
    fb_router_route(r, t, b3, l3, NULL, UINT64_MAX, 5001);  /* past the limit: still once */
    CHECK_EQ(fb_router_full(r, due, 8), 1);
    CHECK_EQ(due[0], 2);
    CHECK_EQ(fb_router_full(r, due, 8), 0);
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 5001);  /* not link 2: not again */
    CHECK_EQ(fb_router_full(r, due, 8), 0);
    CHECK_EQ(fb_router_due(r, 5001, due, 8), 1);   /* link 2 full; link 1 waits for 6000 */
    CHECK_EQ(due[0], 2);
    CHECK_EQ(fb_router_deadline(r), 0);
    take_and_free(r, 2, 5001);
    CHECK_EQ(fb_router_due(r, 5001, due, 8), 0);
    CHECK_EQ(fb_router_deadline(r), 6000);
    /* A link listed by route() but emptied before full() is not reported. */
    fb_router_route(r, t, b3, l3, NULL, UINT64_MAX, 5002);
    take_and_free(r, 2, 5002);
    CHECK_EQ(fb_router_full(r, due, 8), 0);
    /* A clock that goes backwards does not make a batch due early. */
    CHECK_EQ(fb_router_due(r, 10, due, 8), 0);
    fb_free(b1);
    fb_free(b3);
    fb_router_free(r);
    fb_trie_free(t);
}

/* A held link (its connection blocked) is due only when full. */
static void test_hold(void)
{
    fb_trie *t = fb_trie_new();
    fb_outbox_limits lim = { 2, 0, 0, 0 };
    fb_router *r = fb_router_new(&lim);
    fb_router_add_link(r, 7);
    fb_trie_add(t, "z", 1, FB_EXACT, 7);
    const char *one[] = { "z" };
    size_t l1;
    unsigned char *b1 = batch_of(one, 1, &l1);
    uint32_t due[8];
    CHECK_EQ(fb_router_held(r, 7), 0);
    fb_router_hold(r, 7, 1);
    fb_router_hold(r, 99, 1);                       /* unknown: ignored */
    CHECK_EQ(fb_router_held(r, 7), 1);
    CHECK_EQ(fb_router_held(r, 99), 0);
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 1);
    CHECK_EQ(fb_router_due(r, 1, due, 8), 0);
    CHECK_EQ(fb_router_deadline(r), UINT64_MAX);    /* nothing to wake up for */
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 2);
    CHECK_EQ(fb_router_full(r, due, 8), 1);
    CHECK_EQ(fb_router_due(r, 2, due, 8), 1);      /* full: due although held */
    take_and_free(r, 7, 2);
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 3);
    CHECK_EQ(fb_router_due(r, 3, due, 8), 0);
    fb_router_hold(r, 7, 0);                        /* released: due again */
    CHECK_EQ(fb_router_held(r, 7), 0);
    CHECK_EQ(fb_router_due(r, 3, due, 8), 1);
    /* Removing and adding again starts idle and not held. */
    fb_router_hold(r, 7, 1);
    CHECK_EQ(fb_router_remove_link(r, 7), 1);
    CHECK_EQ(fb_router_add_link(r, 7), FB_OK);
    CHECK_EQ(fb_router_held(r, 7), 0);
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 4);
    CHECK_EQ(fb_router_due(r, 4, due, 8), 1);
    /* Direct appends: touch() lists the link, and a full one for full(). */
    fb_outbox *ob = fb_router_outbox(r, 7);
    CHECK_EQ(fb_outbox_append(ob, "z", 1, "p", 1, 4), 1);
    fb_router_touch(r, 7);
    CHECK_EQ(fb_router_full(r, due, 8), 1);
    fb_free(b1);
    fb_router_free(r);
    fb_trie_free(t);
}

static void test_rejected_batch_routes_nothing(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    fb_router_add_link(r, 1);
    fb_trie_add(t, "a", 1, FB_PREFIX, 1);
    const char *topics[] = { "a", "ab", "ac" };
    size_t len;
    unsigned char *b = batch_of(topics, 3, &len);
    for (size_t cut = 0; cut < len; cut++) CHECK(fb_router_route(r, t, b, cut, NULL, 0, 0) < 0);
    unsigned char evil[] = { 'F', 'B', 1, 0, 0xff, 0xff, 0xff, 0xff, 0, 0 };
    CHECK_EQ(fb_router_route(r, t, evil, sizeof evil, NULL, 0, 0), FB_ETRUNCATED);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 1)), 0);
    fb_decode_limits many = { 0, 0, 2, 0 };         /* over max_records: refused whole */
    CHECK_EQ(fb_router_route(r, t, b, len, &many, 0, 0), FB_ELIMIT);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 1)), 0);
    /* Over max_topic: those records only are not routed (and counted). */
    fb_decode_limits lim = { 1, 0, 0, 0 };
    CHECK_EQ(fb_router_route(r, t, b, len, &lim, 0, 0), 3);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 1)), 1);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 0, 0), 3);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 1)), 4);
    fb_router_stats st;
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.rejected, len + 2);
    CHECK_EQ(st.oversize, 2);
    CHECK_EQ(st.records, 6);
    fb_free(b);
    fb_router_free(r);
    fb_trie_free(t);
}

/* A catch-all link (a broker's upstream link whose lease ran out): from its
 * time on it receives every record once, never its own, and before that
 * only what it subscribed to. */
static void test_catchall(void)
{
    fb_trie *t = fb_trie_new();
    fb_outbox_limits lim = { 0, 0, 1000, 0 };
    fb_router *r = fb_router_new(&lim);
    for (uint32_t l = 1; l <= 2; l++) CHECK_EQ(fb_router_add_link(r, l), FB_OK);
    fb_trie_add(t, "a", 1, FB_EXACT, 1);
    fb_trie_add(t, "a", 1, FB_PREFIX, 2);       /* link 2 (the catch-all) wants "a*" too */
    fb_router_set_catchall(r, 2, 1000);
    const char *topics[] = { "a", "b", "ab" };
    size_t len;
    unsigned char *b = batch_of(topics, 3, &len);
    fb_record recs[64];
    unsigned char *keep;
    /* Before its time: only its own subscriptions. */
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 9, 999), 3);
    size_t n = take_records(r, 2, recs, &keep);
    CHECK_EQ(n, 2);                               /* "a", "ab" */
    fb_free(keep);
    n = take_records(r, 1, recs, &keep);
    CHECK_EQ(n, 1);
    fb_free(keep);
    /* From its time on: everything, each record once, in order. */
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 9, 1000), 3);
    n = take_records(r, 2, recs, &keep);
    CHECK_EQ(n, 3);
    CHECK(n == 3 && recs[0].topic[0] == 'a' && recs[1].topic[0] == 'b' && recs[2].topic_len == 2);
    fb_free(keep);
    n = take_records(r, 1, recs, &keep);
    CHECK_EQ(n, 1);
    fb_free(keep);
    fb_router_stats st;
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.unrouted, 1);                     /* "b" before the catch-all's time */
    /* Never its own records back. */
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 2, 2000), 3);
    n = take_records(r, 2, recs, &keep);
    CHECK_EQ(n, 0);
    n = take_records(r, 1, recs, &keep);
    CHECK_EQ(n, 1);
    fb_free(keep);
    /* Cleared: subscriptions only again. */
    fb_router_set_catchall(r, UINT32_MAX, 0);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 9, 3000), 3);
    n = take_records(r, 2, recs, &keep);
    CHECK_EQ(n, 2);
    fb_free(keep);
    n = take_records(r, 1, recs, &keep);
    fb_free(keep);
    fb_free(b);
    fb_router_free(r);
    fb_trie_free(t);
}

/* A glob is held in the trie under its literal prefix by an id of its own;
 * the router matches it exactly, delivers to its link, never twice to one
 * link, and frees it. */
static void test_globs_matched_at_the_router(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    for (uint32_t l = 1; l <= 3; l++) CHECK_EQ(fb_router_add_link(r, l), FB_OK);
    uint64_t g1, g2, g3, g4;
    CHECK_EQ(fb_router_add_glob(r, 1, "user.*.events", 13, &g1), FB_OK);
    CHECK_EQ(fb_router_add_glob(r, 1, "user.?", 6, &g2), FB_OK);
    CHECK_EQ(fb_router_add_glob(r, 2, "*b", 2, &g3), FB_OK);
    CHECK_EQ(fb_router_add_glob(r, 3, "user.1.events", 13, &g4), FB_OK);
    CHECK(g1 >= FB_ROUTER_GLOB_BASE && g2 != g1 && g3 != g2 && g4 != g3);
    CHECK_EQ(fb_router_glob_count(r), 4);
    fb_trie_add(t, "user.", 5, FB_PREFIX, g1);
    fb_trie_add(t, "user.", 5, FB_PREFIX, g2);
    fb_trie_add(t, "", 0, FB_PREFIX, g3);
    fb_trie_add(t, "user.1.events", 13, FB_PREFIX, g4);
    fb_trie_add(t, "user.1.events", 13, FB_EXACT, 1);   /* link 1 also holds the channel */
    const char *topics[] = { "user.1.events", "user.2", "user.22", "b", "user.1.eventsb" };
    size_t len;
    unsigned char *b = batch_of(topics, 5, &len);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, UINT64_MAX, 100), 5);
    fb_record recs[64];
    unsigned char *keep;
    size_t n = take_records(r, 1, recs, &keep);
    CHECK_EQ(n, 2);                               /* user.1.events once (channel and glob), user.2 */
    CHECK(n == 2 && recs[0].payload[1] == '0' && recs[1].payload[1] == '1');
    fb_free(keep);
    n = take_records(r, 2, recs, &keep);
    CHECK_EQ(n, 2);                               /* b, user.1.eventsb */
    CHECK(n == 2 && recs[0].payload[1] == '3' && recs[1].payload[1] == '4');
    fb_free(keep);
    n = take_records(r, 3, recs, &keep);
    CHECK_EQ(n, 1);                               /* a glob with no special character: exact */
    fb_free(keep);
    fb_router_stats st;
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.unrouted, 1);                     /* user.22: under user. but matching no glob */
    /* Removed: the id is refused again, and reused. */
    CHECK_EQ(fb_router_remove_glob(r, g2), FB_OK);
    CHECK_EQ(fb_router_remove_glob(r, g2), FB_ENOTFOUND);
    CHECK_EQ(fb_router_remove_glob(r, 7), FB_ENOTFOUND);
    CHECK_EQ(fb_router_glob_count(r), 3);
    uint64_t g5;
    CHECK_EQ(fb_router_add_glob(r, 1, "x", 1, &g5), FB_OK);
    CHECK_EQ(g5, g2);
    CHECK_EQ(fb_router_add_glob(r, 0x80000000u, "x", 1, &g5), FB_EINVAL);
    /* A glob id whose glob went (the trie entry left behind) routes nothing. */
    CHECK_EQ(fb_router_remove_glob(r, g3), FB_OK);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, UINT64_MAX, 200), 5);
    n = take_records(r, 2, recs, &keep);
    CHECK_EQ(n, 0);
    fb_free(keep);
    fb_free(b);
    fb_router_free(r);
    fb_trie_free(t);
}

/* Headers go through with their records: a link whose batch starts
 * with plain records and then gets one with headers sees both as they
 * were; max_payload counts the headers; a link that gets only plain
 * records gets a header-less batch. */
static void test_headers_routed(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    CHECK_EQ(fb_router_add_link(r, 1), FB_OK);
    CHECK_EQ(fb_router_add_link(r, 2), FB_OK);
    fb_trie_add(t, "h", 1, FB_PREFIX, 1);
    fb_trie_add(t, "p", 1, FB_EXACT, 2);
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    unsigned char blk[] = { 2, 't', 'p', 3, '0', '0', '1' };
    REQUIRE(fb_outbox_append_h(&o, "h.1", 3, NULL, 0, "one", 3, 0) >= 0);
    REQUIRE(fb_outbox_append_h(&o, "p", 1, NULL, 0, "two", 3, 0) >= 0);
    REQUIRE(fb_outbox_append_h(&o, "h.2", 3, blk, sizeof blk, "three", 5, 0) >= 0);
    unsigned char *b, *keep;
    size_t len;
    REQUIRE(fb_outbox_take(&o, &b, &len) == FB_OK);
    fb_outbox_destroy(&o);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 0, 1), 3);
    fb_record recs[64];
    size_t n = take_records(r, 1, recs, &keep);
    CHECK_EQ(n, 2);
    CHECK(n == 2 && recs[0].headers == NULL && recs[0].payload_len == 3);
    CHECK(n == 2 && recs[1].headers_len == sizeof blk && !memcmp(recs[1].headers, blk, sizeof blk) &&
          recs[1].payload_len == 5 && !memcmp(recs[1].payload, "three", 5));
    CHECK(keep[3] & FB_BATCH_F_HEADERS);
    fb_free(keep);
    n = take_records(r, 2, recs, &keep);
    CHECK(n == 1 && !(keep[3] & FB_BATCH_F_HEADERS));
    fb_free(keep);
    /* A link set to go without headers gets the records bare. */
    fb_router_set_headers(r, 1, 0, 0);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 0, 2), 3);
    n = take_records(r, 1, recs, &keep);
    CHECK(n == 2 && recs[1].headers == NULL && recs[1].payload_len == 5 && !(keep[3] & FB_BATCH_F_HEADERS));
    fb_free(keep);
    fb_router_set_headers(r, 1, 1, 0);
    /* 5 + 7 bytes is over a max_payload of 11: only h.2 is oversize. */
    fb_decode_limits lim = { 0, 11, 0, 0 };
    CHECK_EQ(fb_router_route(r, t, b, len, &lim, 0, 3), 3);   /* (the records of the batch) */
    n = take_records(r, 1, recs, &keep);
    CHECK(n == 1 && recs[0].payload_len == 3);
    fb_free(keep);
    fb_router_stats st;
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.oversize, 1);
    fb_free(b);
    fb_router_free(r);
    fb_trie_free(t);
}

/* Repeats through a router: a batch whose records repeat their block, in;
 * out, each link's records in turn, repeats only to a link that reads them
 * and only where the record before on that link had the same block (link 2
 * gets every other record: they repeat among themselves). */
static void test_headers_again_routed(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    CHECK_EQ(fb_router_add_link(r, 1), FB_OK);
    CHECK_EQ(fb_router_add_link(r, 2), FB_OK);
    CHECK_EQ(fb_router_add_link(r, 3), FB_OK);
    fb_trie_add(t, "a", 1, FB_PREFIX, 1);
    fb_trie_add(t, "a.0", 3, FB_EXACT, 2);
    fb_trie_add(t, "a", 1, FB_PREFIX, 3);
    fb_router_set_headers(r, 1, 1, 1);
    fb_router_set_headers(r, 2, 1, 1);
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    fb_outbox_set_again(&o, 1);
    unsigned char blk[] = { 2, 'c', 't', 4, 'j', 's', 'o', 'n' }, blk2[] = { 1, 'k', 1, 'v' };
    for (int i = 0; i < 8; i++) {
        const char *topic = i % 2 ? "a.1" : "a.0";
        int two = i == 5;
        REQUIRE(fb_outbox_append_h(&o, topic, 3, two ? blk2 : blk, two ? sizeof blk2 : sizeof blk, "p", 1, 0) >= 0);
    }
    unsigned char *b, *keep;
    size_t len;
    REQUIRE(fb_outbox_take(&o, &b, &len) == FB_OK);
    fb_outbox_destroy(&o);
    CHECK(b[3] & FB_BATCH_F_HEADERS_AGAIN);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 0, 9), 8);
    fb_record recs[64];
    size_t bytes[4] = { 0 };
    for (uint32_t link = 1; link <= 3; link++) {
        bytes[link] = fb_outbox_bytes(fb_router_outbox(r, link));
        size_t n = take_records(r, link, recs, &keep);
        CHECK_EQ(n, link == 2 ? 4 : 8);
        for (size_t i = 0; i < n; i++) {
            int two = link != 2 && i == 5;
            CHECK_EQ(recs[i].headers_len, two ? sizeof blk2 : sizeof blk);
            CHECK(!memcmp(recs[i].headers, two ? blk2 : blk, recs[i].headers_len));
        }
        CHECK_EQ(!!(keep[3] & FB_BATCH_F_HEADERS_AGAIN), link != 3);
        fb_free(keep);
    }
    /* Link 1: blocks carried at records 0, 5 and 6 only (5 repeats). */
    CHECK_EQ(bytes[3] - bytes[1], 5 * sizeof blk);
    fb_free(b);
    fb_router_free(r);
    fb_trie_free(t);
}

/* A request (:reply-to first in its headers) that reaches nobody, from a
 * link set to be answered, gets a no-responders reply on its reply
 * channel (the requester's own link included, after the batch's other
 * records); one that reaches a subscriber, or comes from a link not set
 * (another broker), gets none. */
static void test_no_responders(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    CHECK_EQ(fb_router_add_link(r, 1), FB_OK);      /* the requester */
    CHECK_EQ(fb_router_add_link(r, 2), FB_OK);      /* a responder of "svc" */
    fb_router_set_notify(r, 1, 1);
    fb_trie_add(t, "_INBOX.a.", 9, FB_PREFIX, 1);
    fb_trie_add(t, "svc", 3, FB_EXACT, 2);
    unsigned char req1[] = { 9, ':', 'r', 'e', 'p', 'l', 'y', '-', 't', 'o', 10,
                             '_', 'I', 'N', 'B', 'O', 'X', '.', 'a', '.', '1' };
    unsigned char req2[sizeof req1];
    memcpy(req2, req1, sizeof req1);
    req2[sizeof req2 - 1] = '2';
    unsigned char plain[] = { 2, 't', 'p', 1, 'x' };     /* headers, but no :reply-to */
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    REQUIRE(fb_outbox_append_h(&o, "svc", 3, req1, sizeof req1, "q1", 2, 0) >= 0);
    REQUIRE(fb_outbox_append_h(&o, "nobody", 6, req2, sizeof req2, "q2", 2, 0) >= 0);
    REQUIRE(fb_outbox_append_h(&o, "nobody", 6, plain, sizeof plain, "q3", 2, 0) >= 0);
    REQUIRE(fb_outbox_append_h(&o, "_INBOX.a.7", 10, NULL, 0, "r7", 2, 0) >= 0);
    unsigned char *b, *keep;
    size_t len;
    REQUIRE(fb_outbox_take(&o, &b, &len) == FB_OK);
    fb_outbox_destroy(&o);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 1), 4);
    fb_record recs[64];
    size_t n = take_records(r, 2, recs, &keep);
    CHECK(n == 1 && recs[0].payload_len == 2 && !memcmp(recs[0].payload, "q1", 2));
    fb_free(keep);
    n = take_records(r, 1, recs, &keep);      /* (split horizon kept "_INBOX.a.7" from it) */
    CHECK_EQ(n, 1);
    CHECK(n == 1 && recs[0].topic_len == 10 && !memcmp(recs[0].topic, "_INBOX.a.2", 10) && recs[0].payload_len == 0);
    if (n == 1) {
        const unsigned char *p = recs[0].headers;
        fb_header h;
        CHECK(fb_headers_next(&p, recs[0].headers + recs[0].headers_len, &h) == 1);
        CHECK(h.key_len == 7 && !memcmp(h.key, ":status", 7) && h.value_len == 3 && !memcmp(h.value, "503", 3));
        const unsigned char *to;
        uint32_t tl;
        CHECK(!fb_record_reply_to(&recs[0], &to, &tl));
    }
    fb_free(keep);
    fb_router_stats st;
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.no_responders, 1);
    CHECK_EQ(st.unrouted, 3);            /* q2, q3, and "_INBOX.a.7" (split horizon) */
    /* From a link not set (another broker): no reply. */
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 2, 2), 4);
    CHECK(fb_outbox_count(fb_router_outbox(r, 1)) == 1);    /* only "_INBOX.a.7" */
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.no_responders, 1);
    fb_free(b);
    fb_router_free(r);
    fb_trie_free(t);
}

/* Queue groups: each record to one member, round robin, never the
 * source; a plain subscriber of the channel still gets every one; a held
 * member is passed over while another is free, an away one while another
 * is not away; a glob group matches its pattern; leaving and removing. */
static void test_queue_groups(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    for (uint32_t l = 1; l <= 5; l++) CHECK_EQ(fb_router_add_link(r, l), FB_OK);
    uint64_t g, gg;
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &g), FB_OK);
    CHECK(g >= FB_ROUTER_GROUP_BASE);
    for (uint32_t l = 1; l <= 3; l++) CHECK_EQ(fb_router_group_join(r, g, l), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 2), FB_OK);              /* (idempotent) */
    CHECK_EQ(fb_router_group_size(r, g), 3);
    fb_trie_add(t, "jobs", 4, FB_EXACT, g);
    fb_trie_add(t, "jobs", 4, FB_EXACT, 4);                       /* a plain subscriber */
    const char *six[] = { "jobs", "jobs", "jobs", "jobs", "jobs", "jobs" };
    size_t len;
    unsigned char *b = batch_of(six, 6, &len);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 5, 1), 6);
    fb_record recs[64];
    unsigned char *keep;
    size_t seen = 0;
    for (uint32_t l = 1; l <= 3; l++) {                           /* two each, in turn */
        size_t n = take_records(r, l, recs, &keep);
        CHECK_EQ(n, 2);
        seen += n;
        fb_free(keep);
    }
    CHECK_EQ(seen, 6);
    CHECK_EQ(take_records(r, 4, recs, &keep), 6);
    fb_free(keep);
    /* From a member: never back to it. */
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 2), 6);
    CHECK(fb_outbox_count(fb_router_outbox(r, 1)) == 0);
    CHECK(fb_outbox_count(fb_router_outbox(r, 2)) == 3 && fb_outbox_count(fb_router_outbox(r, 3)) == 3);
    for (uint32_t l = 2; l <= 4; l++) take_and_free(r, l, 3);
    /* Held: passed over while another is free; away: after the held. */
    fb_router_hold(r, 2, 1);
    fb_router_set_away(r, 3, 1);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 5, 4), 6);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 1)), 6);
    take_and_free(r, 1, 5);
    CHECK_EQ(fb_router_group_leave(r, g, 1), FB_OK);
    CHECK_EQ(fb_router_group_leave(r, g, 1), FB_ENOTFOUND);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 5, 6), 6);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 2)), 6);       /* held, but not away */
    fb_router_hold(r, 2, 0);
    take_and_free(r, 2, 7);
    CHECK_EQ(fb_router_group_leave(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 5, 8), 6);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 3)), 6);       /* the only one: away or not */
    take_and_free(r, 3, 9);
    take_and_free(r, 4, 9);                                      /* (the plain subscriber's) */
    for (uint32_t l = 1; l <= 5; l++) CHECK(fb_outbox_count(fb_router_outbox(r, l)) == 0);
    /* A glob group: only what its pattern matches, to one member. */
    CHECK_EQ(fb_router_add_group(r, "job?.*", 6, &gg), FB_OK);
    CHECK(gg != g);
    CHECK_EQ(fb_router_group_join(r, gg, 4), FB_OK);
    CHECK_EQ(fb_router_group_join(r, gg, 5), FB_OK);
    fb_trie_add(t, "job", 3, FB_PREFIX, gg);
    const char *mixed[] = { "jobs.a", "jobx.b", "job.c", "jobs", "jobs.d" };
    unsigned char *b2 = batch_of(mixed, 5, &len);
    CHECK_EQ(fb_router_route(r, t, b2, len, NULL, 1, 10), 5);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 4)) + fb_outbox_count(fb_router_outbox(r, 5)), 3 + 1);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 3)), 1);       /* "jobs": group g */
    /* Removed: routes nothing; its id is given again. */
    CHECK_EQ(fb_router_remove_group(r, g), FB_OK);
    CHECK_EQ(fb_router_remove_group(r, g), FB_ENOTFOUND);
    CHECK_EQ(fb_router_group_size(r, g), 0);
    CHECK_EQ(fb_router_group_join(r, g, 1), FB_ENOTFOUND);
    uint64_t again;
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &again), FB_OK);
    CHECK_EQ(again, g);
    fb_free(b);
    fb_free(b2);
    fb_router_free(r);
    fb_trie_free(t);
}

/* A batch of `n` records on `topic`, each with header block `blk`. */
static unsigned char *batch_with(const char *topic, int n, const unsigned char *blk, size_t blen, size_t *len)
{
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    for (int i = 0; i < n; i++)
        REQUIRE(fb_outbox_append_h(&o, topic, strlen(topic), blk, (uint32_t)blen, "x", 1, 0) >= 0);
    unsigned char *b;
    REQUIRE(fb_outbox_take(&o, &b, len) == FB_OK);
    fb_outbox_destroy(&o);
    return b;
}

/* Queue groups across brokers: a record from a client is picked for by
 * the group among all members (a broker link among them gets it naming the
 * group in :groups, after :reply-to); one from a broker link only by the
 * groups it names; every other copy goes without :groups. */
static void test_queue_groups_across_brokers(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    for (uint32_t l = 1; l <= 4; l++) CHECK_EQ(fb_router_add_link(r, l), FB_OK);
    fb_router_set_broker(r, 2, 1);             /* a broker with members behind it */
    fb_router_set_broker(r, 4, 1);             /* a broker with a plain subscriber */
    uint64_t g, local;
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &g), FB_OK);
    CHECK_EQ(fb_router_set_group_mark(r, g, "", 0), FB_EINVAL);
    CHECK_EQ(fb_router_set_group_mark(r, g, "0123456789abcdef0123456789abcdefX", 33), FB_EINVAL);
    CHECK_EQ(fb_router_set_group_mark(r, g, "M1", 2), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 1), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 2), FB_OK);
    fb_trie_add(t, "jobs", 4, FB_EXACT, g);
    fb_trie_add(t, "jobs", 4, FB_EXACT, 4);
    size_t len, blen;
    fb_record recs[64];
    unsigned char *keep, *b = batch_with("jobs", 4, NULL, 0, &blen);
    static const unsigned char named[] = { 7, ':', 'g', 'r', 'o', 'u', 'p', 's', 3, 2, 'M', '1' };
    /* From a client: two each to the members, the broker's naming M1. */
    CHECK_EQ(fb_router_route(r, t, b, blen, NULL, 3, 1), 4);
    CHECK_EQ(take_records(r, 1, recs, &keep), 2);
    CHECK(recs[0].headers_len == 0 && recs[1].headers_len == 0);
    fb_free(keep);
    CHECK_EQ(take_records(r, 2, recs, &keep), 2);
    CHECK(recs[0].headers_len == sizeof named && !memcmp(recs[0].headers, named, sizeof named));
    fb_free(keep);
    CHECK_EQ(take_records(r, 4, recs, &keep), 4);
    CHECK(recs[3].headers_len == 0);
    fb_free(keep);
    /* From a broker, naming no group: picked for there. */
    CHECK_EQ(fb_router_route(r, t, b, blen, NULL, 4, 2), 4);
    CHECK(fb_outbox_count(fb_router_outbox(r, 1)) == 0 && fb_outbox_count(fb_router_outbox(r, 2)) == 0);
    /* From the member broker, naming M1 (after :reply-to): ours to pick,
     * never back to it; the plain broker gets it without :groups. */
    static const unsigned char both[] = { 9, ':', 'r', 'e', 'p', 'l', 'y', '-', 't', 'o', 1, 'i',
                                          7, ':', 'g', 'r', 'o', 'u', 'p', 's', 3, 2, 'M', '1',
                                          1, 'k', 1, 'v' };
    unsigned char *b2 = batch_with("jobs", 3, both, sizeof both, &len);
    CHECK_EQ(fb_router_route(r, t, b2, len, NULL, 2, 3), 3);
    CHECK_EQ(take_records(r, 1, recs, &keep), 3);
    static const unsigned char bare[] = { 9, ':', 'r', 'e', 'p', 'l', 'y', '-', 't', 'o', 1, 'i', 1, 'k', 1, 'v' };
    CHECK(recs[2].headers_len == sizeof bare && !memcmp(recs[2].headers, bare, sizeof bare));
    fb_free(keep);
    CHECK_EQ(take_records(r, 4, recs, &keep), 3);
    CHECK(recs[0].headers_len == sizeof bare && !memcmp(recs[0].headers, bare, sizeof bare));
    fb_free(keep);
    CHECK(fb_outbox_count(fb_router_outbox(r, 2)) == 0);
    /* From a client, a request (:reply-to first): a broker picked gets it
     * with :reply-to still first, :groups second. */
    fb_router_group_leave(r, g, 1);
    /* Given us for M1, which has no member here now (but the giver): lost,
     * and counted, one a record. */
    fb_router_stats st;
    CHECK_EQ(fb_router_route(r, t, b2, len, NULL, 2, 3), 3);
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.group_orphaned, 3);
    take_and_free(r, 4, 3);
    unsigned char *b3 = batch_with("jobs", 1, bare, sizeof bare, &len);
    CHECK_EQ(fb_router_route(r, t, b3, len, NULL, 3, 4), 1);
    CHECK_EQ(take_records(r, 2, recs, &keep), 1);
    CHECK(recs[0].headers_len == sizeof both && !memcmp(recs[0].headers, both, sizeof both));
    fb_free(keep);
    take_and_free(r, 4, 5);
    /* Two groups picking one broker: one copy, naming both; a group
     * without a mark is this router's alone (it picks for a broker's
     * record too, and names itself to nobody). */
    uint64_t g2;
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &g2), FB_OK);
    CHECK_EQ(fb_router_set_group_mark(r, g2, "M2", 2), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g2, 2), FB_OK);
    fb_trie_add(t, "jobs", 4, FB_EXACT, g2);
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &local), FB_OK);
    CHECK_EQ(fb_router_group_join(r, local, 1), FB_OK);
    fb_trie_add(t, "jobs", 4, FB_EXACT, local);
    CHECK_EQ(fb_router_route(r, t, b, blen, NULL, 3, 6), 4);       /* (b: 4 records without headers) */
    CHECK_EQ(take_records(r, 2, recs, &keep), 4);
    static const unsigned char two[] = { 7, ':', 'g', 'r', 'o', 'u', 'p', 's', 6, 2, 'M', '1', 2, 'M', '2' };
    static const unsigned char two_r[] = { 7, ':', 'g', 'r', 'o', 'u', 'p', 's', 6, 2, 'M', '2', 2, 'M', '1' };
    CHECK(recs[0].headers_len == sizeof two && (!memcmp(recs[0].headers, two, sizeof two) ||
                                                !memcmp(recs[0].headers, two_r, sizeof two_r)));
    fb_free(keep);
    CHECK_EQ(take_records(r, 1, recs, &keep), 4);                 /* the local group's only member */
    fb_free(keep);
    take_and_free(r, 4, 7);
    CHECK_EQ(fb_router_route(r, t, b, blen, NULL, 4, 8), 4);       /* from a broker: the local group picks */
    CHECK_EQ(take_records(r, 1, recs, &keep), 4);
    fb_free(keep);
    CHECK(fb_outbox_count(fb_router_outbox(r, 2)) == 0);
    /* A malformed :groups value names nothing. */
    static const unsigned char bad[] = { 7, ':', 'g', 'r', 'o', 'u', 'p', 's', 2, 9, 'M' };
    unsigned char *b4 = batch_with("jobs", 1, bad, sizeof bad, &len);
    CHECK_EQ(fb_router_route(r, t, b4, len, NULL, 2, 9), 1);
    CHECK_EQ(take_records(r, 1, recs, &keep), 1);                 /* (the local group) */
    CHECK(recs[0].headers_len == 0);
    fb_free(keep);
    take_and_free(r, 4, 10);
    CHECK(fb_outbox_count(fb_router_outbox(r, 2)) == 0);
    fb_free(b);
    fb_free(b2);
    fb_free(b3);
    fb_free(b4);
    fb_router_free(r);
    fb_trie_free(t);
}

/* What a member that ran out was given goes to the group's other members
 * only (not to plain subscribers again), from the record it stopped at. */
static void test_route_to_groups(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    for (uint32_t l = 1; l <= 4; l++) CHECK_EQ(fb_router_add_link(r, l), FB_OK);
    uint64_t g, other;
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &g), FB_OK);
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &other), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 1), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_group_join(r, other, 3), FB_OK);
    fb_trie_add(t, "jobs", 4, FB_EXACT, g);
    fb_trie_add(t, "jobs", 4, FB_EXACT, other);
    fb_trie_add(t, "jobs", 4, FB_EXACT, 4);
    const char *four[] = { "jobs", "jobs", "jobs", "jobs" };
    size_t len;
    unsigned char *b = batch_of(four, 4, &len);
    CHECK_EQ(fb_router_route_groups(r, t, b, len, 1, &g, 1, 1, 1), 3);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 2)), 3);        /* the other member, from the second */
    CHECK(fb_outbox_count(fb_router_outbox(r, 1)) == 0 && fb_outbox_count(fb_router_outbox(r, 3)) == 0 &&
          fb_outbox_count(fb_router_outbox(r, 4)) == 0);
    CHECK_EQ(fb_router_route_groups(r, t, b, len, 4, &g, 1, 1, 2), 0);   /* (nothing past the end) */
    CHECK_EQ(fb_router_route_groups(r, t, b, 3, 0, &g, 1, 1, 2), FB_ETRUNCATED);
    /* Not handed over: what the source also had by a subscription of its
     * own, what two of its groups matched (which one gave it?). */
    take_and_free(r, 2, 3);
    fb_trie_add(t, "jobs", 4, FB_EXACT, 1);
    CHECK_EQ(fb_router_route_groups(r, t, b, len, 0, &g, 1, 1, 4), 0);
    fb_trie_remove(t, "jobs", 4, FB_EXACT, 1);
    CHECK_EQ(fb_router_group_join(r, other, 1), FB_OK);
    uint64_t both[] = { g, other };
    CHECK_EQ(fb_router_route_groups(r, t, b, len, 0, both, 2, 1, 5), 0);
    for (uint32_t l = 1; l <= 4; l++) CHECK(fb_outbox_count(fb_router_outbox(r, l)) == 0);
    /* To a member that is another broker: naming the group, for it only
     * (the empty mark first): that broker gives it to no plain subscriber. */
    CHECK_EQ(fb_router_group_leave(r, other, 1), FB_OK);
    CHECK_EQ(fb_router_set_group_mark(r, g, "M1", 2), FB_OK);
    fb_router_set_broker(r, 2, 1);
    CHECK_EQ(fb_router_route_groups(r, t, b, len, 0, &g, 1, 1, 6), 4);
    fb_record recs[64];
    unsigned char *keep;
    static const unsigned char only[] = { 7, ':', 'g', 'r', 'o', 'u', 'p', 's', 4, 0, 2, 'M', '1' };
    CHECK_EQ(take_records(r, 2, recs, &keep), 4);
    CHECK(recs[0].headers_len == sizeof only && !memcmp(recs[0].headers, only, sizeof only));
    /* ... and that broker (here: this router, the record from link 2): its
     * group's member gets it, its plain subscriber does not. */
    CHECK_EQ(fb_router_remove_group(r, other), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 3), FB_OK);
    size_t klen = 0;
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    for (int i = 0; i < 4; i++)
        REQUIRE(fb_outbox_append_h(&o, "jobs", 4, recs[i].headers, recs[i].headers_len, "x", 1, 0) >= 0);
    unsigned char *again;
    REQUIRE(fb_outbox_take(&o, &again, &klen) == FB_OK);
    fb_outbox_destroy(&o);
    fb_free(keep);
    CHECK_EQ(fb_router_route(r, t, again, klen, NULL, 2, 7), 4);
    CHECK(fb_outbox_count(fb_router_outbox(r, 1)) + fb_outbox_count(fb_router_outbox(r, 3)) == 4);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 4)), 0);
    fb_free(again);
    fb_free(b);
    fb_router_free(r);
    fb_trie_free(t);
}

/* The :status a reply the router made carries (its one header). */
static int status_is(const fb_record *rec, const char *code)
{
    const unsigned char *p = rec->headers;
    fb_header h;
    if (!rec->headers_len || fb_headers_next(&p, rec->headers + rec->headers_len, &h) != 1) return 0;
    return h.key_len == 7 && !memcmp(h.key, ":status", 7) && h.value_len == 3 && !memcmp(h.value, code, 3);
}

/* A request block: :reply-to _INBOX.a.<digit>, then :hold <capacity>. */
static size_t hold_block(unsigned char *blk, char digit, const char *capacity)
{
    static const unsigned char head[] = { 9, ':', 'r', 'e', 'p', 'l', 'y', '-', 't', 'o', 10,
                                          '_', 'I', 'N', 'B', 'O', 'X', '.', 'a', '.', '0' };
    size_t n = sizeof head, cl = strlen(capacity);
    memcpy(blk, head, n);
    blk[n - 1] = (unsigned char)digit;
    blk[n++] = 5;
    memcpy(blk + n, ":hold", 5);
    n += 5;
    blk[n++] = (unsigned char)cl;
    memcpy(blk + n, capacity, cl);
    return n + cl;
}

/* Held groups: a record with no member to take it is kept (without its
 * :reply-to and :hold), up to the capacity its :hold names and the
 * router's byte bound, and the request is answered 202, 507 or (a member
 * had it) 200; a member that joins gets the backlog, oldest first, round
 * robin with the others; what is older than an expiry is dropped; a
 * record without :hold is kept too (no answer); removing the group drops
 * what it kept. */
static void test_held_groups(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    for (uint32_t l = 1; l <= 3; l++) CHECK_EQ(fb_router_add_link(r, l), FB_OK);
    fb_router_set_notify(r, 1, 1);                  /* link 1: the sender, whose inbox is _INBOX.a. */
    fb_trie_add(t, "_INBOX.a.", 9, FB_PREFIX, 1);
    uint64_t g;
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &g), FB_OK);
    fb_trie_add(t, "work", 4, FB_EXACT, g);
    CHECK_EQ(fb_router_group_hold(r, 12345), FB_ENOTFOUND);
    CHECK_EQ(fb_router_group_hold(r, g), FB_OK);
    CHECK_EQ(fb_router_group_hold(r, g), FB_OK);    /* (idempotent) */
    unsigned char blk[64];
    size_t len, blen;
    fb_record recs[64];
    unsigned char *keep;
    /* Three sends with capacity 2: two kept (202), one not (507). */
    for (int i = 0; i < 3; i++) {
        blen = hold_block(blk, (char)('1' + i), "2");
        unsigned char *b = batch_with("work", 1, blk, blen, &len);
        CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 10 + (uint64_t)i), 1);
        fb_free(b);
    }
    CHECK_EQ(fb_router_group_held(r, g), 2);
    size_t n = take_records(r, 1, recs, &keep);
    CHECK_EQ(n, 3);
    if (n == 3) {
        CHECK(recs[0].topic_len == 10 && !memcmp(recs[0].topic, "_INBOX.a.1", 10) && status_is(&recs[0], "202"));
        CHECK(status_is(&recs[1], "202") && status_is(&recs[2], "507"));
    }
    fb_free(keep);
    fb_router_stats st;
    fb_router_get_stats(r, &st);
    CHECK(st.held_kept == 2 && st.held_full == 1 && st.no_responders == 0 && st.unrouted == 0);
    /* A record without :hold (no :reply-to either) is kept, unanswered. */
    size_t plen;
    unsigned char *plain = batch_with("work", 1, NULL, 0, &plen);
    CHECK_EQ(fb_router_route(r, t, plain, plen, NULL, 1, 13), 1);
    CHECK_EQ(fb_router_group_held(r, g), 3);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 1)), 0);
    /* Expiry: what came before 11 goes. */
    CHECK_EQ(fb_router_group_expire(r, g, 11), 1);
    CHECK_EQ(fb_router_group_held(r, g), 2);
    /* Two members join: the backlog, oldest first, one each in turn, with
     * the headers the sender's own (none here: :reply-to and :hold left out). */
    CHECK_EQ(fb_router_group_join(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 3), FB_OK);
    CHECK_EQ(fb_router_group_give(r, g, 20), 2);
    CHECK_EQ(fb_router_group_held(r, g), 0);
    CHECK_EQ(fb_router_held_bytes(r), 0);
    n = take_records(r, 2, recs, &keep);
    CHECK(n == 1 && recs[0].headers_len == 0 && recs[0].topic_len == 4);
    fb_free(keep);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 3)), 1);
    take_and_free(r, 3, 21);
    /* With members, a :hold request goes to one and is answered 200. */
    blen = hold_block(blk, '5', "2");
    unsigned char *b = batch_with("work", 1, blk, blen, &len);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 22), 1);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 2)) + fb_outbox_count(fb_router_outbox(r, 3)), 1);
    n = take_records(r, 1, recs, &keep);
    CHECK(n == 1 && status_is(&recs[0], "200"));
    fb_free(keep);
    for (uint32_t l = 2; l <= 3; l++)
        if (fb_outbox_count(fb_router_outbox(r, l))) {
            n = take_records(r, l, recs, &keep);       /* (answered: without :reply-to and :hold) */
            CHECK(n == 1 && recs[0].headers_len == 0);
            fb_free(keep);
        }
    /* The members gone, the byte bound: one record's worth, no more. */
    CHECK_EQ(fb_router_group_leave(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_group_leave(r, g, 3), FB_OK);
    fb_router_set_held_limit(r, 1);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 24), 1);
    CHECK_EQ(fb_router_group_held(r, g), 0);
    n = take_records(r, 1, recs, &keep);
    CHECK(n == 1 && status_is(&recs[0], "507"));
    fb_free(keep);
    fb_router_set_held_limit(r, 0);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 25), 1);
    CHECK_EQ(fb_router_route(r, t, plain, plen, NULL, 1, 25), 1);
    take_and_free(r, 1, 26);
    CHECK_EQ(fb_router_group_held(r, g), 2);
    /* A member that is another broker gets the backlog naming the group. */
    CHECK_EQ(fb_router_set_group_mark(r, g, "M1", 2), FB_OK);
    fb_router_set_broker(r, 2, 1);
    CHECK_EQ(fb_router_group_join(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_group_give(r, g, 27), 2);
    static const unsigned char only[] = { 7, ':', 'g', 'r', 'o', 'u', 'p', 's', 4, 0, 2, 'M', '1' };
    n = take_records(r, 2, recs, &keep);
    CHECK(n == 2 && recs[0].headers_len == sizeof only && !memcmp(recs[0].headers, only, sizeof only));
    fb_free(keep);
    /* Released: what it kept goes (returned, not counted), and it keeps
     * no more; held again, it does. */
    CHECK_EQ(fb_router_group_leave(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_route(r, t, plain, plen, NULL, 1, 27), 1);
    CHECK_EQ(fb_router_group_release(r, g), 1);
    CHECK_EQ(fb_router_group_held(r, g), 0);
    CHECK_EQ(fb_router_held_bytes(r), 0);
    CHECK_EQ(fb_router_route(r, t, plain, plen, NULL, 1, 27), 1);
    CHECK_EQ(fb_router_group_held(r, g), 0);
    CHECK_EQ(fb_router_group_hold(r, g), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 2), FB_OK);
    /* A member whose session is away: the group keeps for it (202), and
     * gives it the backlog once it is back, not before. */
    CHECK_EQ(fb_router_group_leave(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 3), FB_OK);
    fb_router_set_away(r, 3, 1);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 29), 1);
    CHECK_EQ(fb_router_group_held(r, g), 1);
    CHECK_EQ(fb_outbox_count(fb_router_outbox(r, 3)), 0);
    n = take_records(r, 1, recs, &keep);
    CHECK(n == 1 && status_is(&recs[0], "202"));
    fb_free(keep);
    CHECK_EQ(fb_router_group_give(r, g, 30), 0);
    fb_router_set_away(r, 3, 0);
    CHECK_EQ(fb_router_group_give(r, g, 31), 1);
    take_and_free(r, 3, 32);
    CHECK_EQ(fb_router_group_leave(r, g, 3), FB_OK);
    CHECK_EQ(fb_router_group_join(r, g, 2), FB_OK);
    /* Removing a held group drops what it kept, counted. */
    CHECK_EQ(fb_router_group_leave(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_route(r, t, plain, plen, NULL, 1, 28), 1);
    CHECK_EQ(fb_router_remove_group(r, g), FB_OK);
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.held_dropped, 2);
    CHECK_EQ(fb_router_held_bytes(r), 0);
    fb_free(b);
    fb_free(plain);
    fb_router_free(r);
    fb_trie_free(t);
}

/* The held hook (a journal's view of the backlogs): a mirror kept from
 * what it is told alone matches the backlog after keeps, expiry, a give
 * and a removal; a restore puts records back without telling it. */
typedef struct mirror {
    char items[16][8];         /* payloads, oldest first */
    size_t head, count;
    uint64_t at[16];
    int calls;
} mirror;

static void mirror_fn(void *arg, const unsigned char *mark, size_t mark_len, int what, const fb_record *rec,
                      uint64_t at_ns, size_t n)
{
    mirror *m = arg;
    m->calls++;
    CHECK(mark_len == 2 && !memcmp(mark, "HG", 2));
    if (what == FB_HELD_KEPT) {
        CHECK(n == 1 && rec && rec->payload_len < 8 && m->head + m->count < 16);
        if (!rec || rec->payload_len >= 8 || m->head + m->count >= 16) return;
        memcpy(m->items[m->head + m->count], rec->payload, rec->payload_len);
        m->items[m->head + m->count][rec->payload_len] = 0;
        m->at[m->head + m->count] = at_ns;
        m->count++;
    } else {
        CHECK(what == FB_HELD_GONE && n > 0 && n <= m->count);
        if (n > m->count) n = m->count;
        m->head += n;
        m->count -= n;
    }
}

static unsigned char *batch_payloads(const char *topic, const char *const *payloads, int n, size_t *len)
{
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    for (int i = 0; i < n; i++)
        REQUIRE(fb_outbox_append_h(&o, topic, strlen(topic), NULL, 0, payloads[i], strlen(payloads[i]), 0) >= 0);
    unsigned char *b;
    REQUIRE(fb_outbox_take(&o, &b, len) == FB_OK);
    fb_outbox_destroy(&o);
    return b;
}

static int mirror_matches(const mirror *m, const fb_router *r, uint64_t g)
{
    const fb_backlog *bl = fb_router_group_backlog(r, g);
    if (!bl || fb_backlog_count(bl) != m->count) return 0;
    for (size_t i = 0; i < m->count; i++) {
        fb_record rec;
        uint64_t at;
        if (!fb_backlog_at(bl, i, &rec, &at)) return 0;
        if (rec.payload_len != strlen(m->items[m->head + i]) ||
            memcmp(rec.payload, m->items[m->head + i], rec.payload_len) || at != m->at[m->head + i])
            return 0;
    }
    return 1;
}

static void test_held_hook(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    for (uint32_t l = 1; l <= 2; l++) CHECK_EQ(fb_router_add_link(r, l), FB_OK);
    uint64_t g, anon;
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &g), FB_OK);
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &anon), FB_OK);     /* no mark: not told */
    fb_trie_add(t, "job", 3, FB_EXACT, g);
    fb_trie_add(t, "anon", 4, FB_EXACT, anon);
    CHECK_EQ(fb_router_set_group_mark(r, g, "HG", 2), FB_OK);
    CHECK(fb_router_group_backlog(r, g) == NULL);
    CHECK_EQ(fb_router_group_hold(r, g), FB_OK);
    CHECK_EQ(fb_router_group_hold(r, anon), FB_OK);
    mirror m = { 0 };
    fb_router_set_held_hook(r, mirror_fn, &m);
    static const char *const five[] = { "a", "b", "c", "d", "e" };
    size_t len, alen;
    unsigned char *b = batch_payloads("job", five, 5, &len), *ab = batch_payloads("anon", five, 2, &alen);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 100), 5);
    CHECK_EQ(fb_router_route(r, t, ab, alen, NULL, 1, 100), 2);
    CHECK_EQ(m.calls, 5);
    CHECK(mirror_matches(&m, r, g));
    /* Expired: nothing is older than 100; of ten, the five older than 150
     * go, told in one call. */
    CHECK_EQ(fb_router_group_expire(r, g, 100), 0);
    CHECK_EQ(m.calls, 5);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 200), 5);
    CHECK_EQ(fb_router_group_expire(r, g, 150), 5);
    CHECK_EQ(m.calls, 11);
    CHECK(mirror_matches(&m, r, g));
    /* Given to a member: told once, for all of them. */
    CHECK_EQ(fb_router_group_join(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_group_give(r, g, 300), 5);
    CHECK_EQ(m.calls, 12);
    CHECK(mirror_matches(&m, r, g) && m.count == 0);
    take_and_free(r, 2, 301);
    CHECK_EQ(fb_router_group_give(r, g, 302), 0);
    CHECK_EQ(m.calls, 12);                           /* (nothing left: not told) */
    CHECK_EQ(fb_router_group_leave(r, g, 2), FB_OK);
    /* Restored: back in the backlog, oldest first, not told; the byte
     * bound applies. */
    fb_record rec = { .topic = (const unsigned char *)"job", .topic_len = 3,
                      .payload = (const unsigned char *)"zz", .payload_len = 2 };
    CHECK_EQ(fb_router_group_restore(r, anon + 1000, &rec, 7), FB_ENOTFOUND);
    CHECK_EQ(fb_router_group_restore(r, g, &rec, 7), FB_OK);
    CHECK_EQ(m.calls, 12);
    CHECK_EQ(fb_router_group_held(r, g), 1);
    size_t before = fb_router_held_bytes(r);
    fb_router_set_held_limit(r, before + 1);
    CHECK_EQ(fb_router_group_restore(r, g, &rec, 8), FB_ETOOBIG);
    fb_router_set_held_limit(r, 0);
    fb_record got;
    uint64_t at;
    CHECK(fb_backlog_at(fb_router_group_backlog(r, g), 0, &got, &at) && at == 7 && got.payload_len == 2);
    CHECK(!fb_backlog_at(fb_router_group_backlog(r, g), 1, &got, &at));
    m.items[m.head][0] = 'z', m.items[m.head][1] = 'z', m.items[m.head][2] = 0;   /* (the mirror's copy) */
    m.at[m.head] = 7;
    m.count = 1;
    /* Removed with its backlog: told that the rest went. */
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 400), 5);
    CHECK_EQ(m.calls, 17);
    CHECK(mirror_matches(&m, r, g) && m.count == 6);
    CHECK_EQ(fb_router_group_release(r, g), 6);
    CHECK_EQ(m.calls, 18);
    CHECK_EQ(m.count, 0);
    CHECK_EQ(fb_router_remove_group(r, g), FB_OK);
    CHECK_EQ(m.calls, 18);
    fb_free(b);
    fb_free(ab);
    fb_router_free(r);
    fb_trie_free(t);
}

/* Bound channels (fb_router_set_group_topic): a held group under a second
 * key takes its records as published on the group's own channel: kept
 * under that topic (within the bound capacity) while it has no member,
 * given so, and to a member that also subscribes the bound channel
 * plainly, both copies; a record on the group's own channel is as ever. */
static void test_bound_channels(void)
{
    fb_trie *t = fb_trie_new();
    fb_router *r = fb_router_new(NULL);
    for (uint32_t l = 1; l <= 3; l++) CHECK_EQ(fb_router_add_link(r, l), FB_OK);
    uint64_t g, h, glob;
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &g), FB_OK);
    CHECK_EQ(fb_router_add_group(r, NULL, 0, &h), FB_OK);
    CHECK_EQ(fb_router_add_group(r, "w*", 2, &glob), FB_OK);
    CHECK_EQ(fb_router_set_group_topic(r, glob, "work", 4, 0), FB_EINVAL);
    CHECK_EQ(fb_router_set_group_topic(r, 12345, "work", 4, 0), FB_ENOTFOUND);
    CHECK_EQ(fb_router_set_group_topic(r, g, "work", 4, 2), FB_OK);
    CHECK_EQ(fb_router_set_group_topic(r, h, "jobs", 4, 0), FB_OK);
    CHECK_EQ(fb_router_group_hold(r, g), FB_OK);
    CHECK_EQ(fb_router_group_hold(r, h), FB_OK);
    fb_trie_add(t, "work", 4, FB_EXACT, g);
    fb_trie_add(t, "jobs", 4, FB_EXACT, h);
    fb_trie_add(t, "grp", 3, FB_EXACT, g);          /* both bound to "grp" */
    fb_trie_add(t, "grp", 3, FB_EXACT, h);
    size_t len, n;
    fb_record recs[64];
    unsigned char *keep;
    /* No members: three on "grp" kept by each, "work"'s only two (its
     * bound capacity), under their own topics. */
    unsigned char *b = batch_with("grp", 3, NULL, 0, &len);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 1, 10), 3);
    CHECK_EQ(fb_router_group_held(r, g), 2);
    CHECK_EQ(fb_router_group_held(r, h), 3);
    fb_router_stats st;
    fb_router_get_stats(r, &st);
    CHECK(st.held_kept == 5 && st.held_full == 1);
    /* A record on the group's own channel is not bound: no capacity. */
    unsigned char *own = batch_with("work", 1, NULL, 0, &len);
    CHECK_EQ(fb_router_route(r, t, own, len, NULL, 1, 11), 1);
    CHECK_EQ(fb_router_group_held(r, g), 3);
    /* A member joins: the backlog, under "work". */
    CHECK_EQ(fb_router_group_join(r, g, 2), FB_OK);
    CHECK_EQ(fb_router_group_give(r, g, 12), 3);
    n = take_records(r, 2, recs, &keep);
    CHECK_EQ(n, 3);
    for (size_t i = 0; i < n; i++) CHECK(recs[i].topic_len == 4 && !memcmp(recs[i].topic, "work", 4));
    fb_free(keep);
    /* Link 2 also subscribes "grp" plainly, link 3 joins "jobs": a record
     * on "grp" reaches link 2 twice (as "grp" and as "work"), link 3 as
     * "jobs" (h's backlog first, once given). */
    fb_trie_add(t, "grp", 3, FB_EXACT, 2);
    CHECK_EQ(fb_router_group_join(r, h, 3), FB_OK);
    CHECK_EQ(fb_router_group_give(r, h, 13), 3);
    take_and_free(r, 3, 14);
    unsigned char *one = batch_with("grp", 1, NULL, 0, &len);
    CHECK_EQ(fb_router_route(r, t, one, len, NULL, 1, 15), 1);
    n = take_records(r, 2, recs, &keep);
    CHECK_EQ(n, 2);
    if (n == 2) {
        int as_grp = 0, as_work = 0;
        for (size_t i = 0; i < 2; i++) {
            as_grp += recs[i].topic_len == 3 && !memcmp(recs[i].topic, "grp", 3);
            as_work += recs[i].topic_len == 4 && !memcmp(recs[i].topic, "work", 4);
        }
        CHECK(as_grp == 1 && as_work == 1);
    }
    fb_free(keep);
    n = take_records(r, 3, recs, &keep);
    CHECK(n == 1 && recs[0].topic_len == 4 && !memcmp(recs[0].topic, "jobs", 4));
    fb_free(keep);
    /* Never to its source: link 2 sends on "grp", g's only member is 2: g
     * keeps it (a held group without another member). */
    CHECK_EQ(fb_router_route(r, t, one, len, NULL, 2, 16), 1);
    CHECK_EQ(fb_router_group_held(r, g), 1);
    take_and_free(r, 3, 17);
    /* The topic off: records keep their own. */
    CHECK_EQ(fb_router_set_group_topic(r, h, NULL, 0, 0), FB_OK);
    CHECK_EQ(fb_router_route(r, t, one, len, NULL, 1, 18), 1);
    n = take_records(r, 3, recs, &keep);
    CHECK(n == 1 && recs[0].topic_len == 3);
    fb_free(keep);
    take_and_free(r, 2, 19);
    CHECK_EQ(fb_router_remove_group(r, g), FB_OK);   /* (its topic freed with it: ASan) */
    fb_free(b);
    fb_free(own);
    fb_free(one);
    fb_router_free(r);
    fb_trie_free(t);
}

int main(void)
{
    RUN(test_route_and_split_horizon);
    RUN(test_no_linger_everything_due);
    RUN(test_linger);
    RUN(test_hold);
    RUN(test_rejected_batch_routes_nothing);
    RUN(test_catchall);
    RUN(test_globs_matched_at_the_router);
    RUN(test_headers_routed);
    RUN(test_headers_again_routed);
    RUN(test_no_responders);
    RUN(test_queue_groups);
    RUN(test_queue_groups_across_brokers);
    RUN(test_route_to_groups);
    RUN(test_held_groups);
    RUN(test_held_hook);
    RUN(test_bound_channels);
    CTEST_END();
}
