/* Tests of fb_router: routing batches into per-link outboxes. */
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

static void test_due_deadline_and_removal(void)
{
    fb_trie *t = fb_trie_new();
    fb_outbox_limits lim = { 2, 0, 1000, 0 };
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
    fb_router_route(r, t, b1, l1, NULL, UINT64_MAX, 100);
    fb_router_route(r, t, b2, l2, NULL, UINT64_MAX, 500);
    CHECK_EQ(fb_router_deadline(r), 1100);
    CHECK_EQ(fb_router_due(r, 200, due, 8), 1);   /* link 6 by count */
    CHECK_EQ(due[0], 6);
    CHECK_EQ(fb_router_due(r, 1100, due, 8), 2);  /* and link 5 by age */
    CHECK_EQ(fb_router_pending(r, due, 1), 1);    /* a cap is honoured */
    CHECK_EQ(fb_router_remove_link(r, 6), 2);
    CHECK(fb_router_outbox(r, 6) == NULL && !fb_router_has_link(r, 6));
    CHECK_EQ(fb_router_due(r, 1100, due, 8), 1);
    unsigned char *keep;
    size_t len;
    fb_outbox_take(fb_router_outbox(r, 5), &keep, &len);
    fb_free(keep);
    CHECK_EQ(fb_router_due(r, 5000, due, 8), 0);
    CHECK_EQ(fb_router_deadline(r), UINT64_MAX);
    CHECK_EQ(fb_router_add_link(r, 0x80000000u), FB_EINVAL);
    fb_free(b1);
    fb_free(b2);
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
    fb_decode_limits lim = { 1, 0, 0, 0 };
    CHECK_EQ(fb_router_route(r, t, b, len, &lim, 0, 0), FB_ELIMIT);
    CHECK_EQ(fb_router_route(r, t, b, len, NULL, 0, 0), 3);
    fb_router_stats st;
    fb_router_get_stats(r, &st);
    CHECK_EQ(st.rejected, len + 2);
    fb_free(b);
    fb_router_free(r);
    fb_trie_free(t);
}

int main(void)
{
    RUN(test_route_and_split_horizon);
    RUN(test_due_deadline_and_removal);
    RUN(test_rejected_batch_routes_nothing);
    CTEST_END();
}
