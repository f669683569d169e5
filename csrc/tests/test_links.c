/* test_links.c - the data plane's table of links (fb_links.h): lookup by
 * routing id through growth, tombstones and reuse of an id; the lists
 * grown with the table; events in order, one link's forgotten; the
 * slow-consumer policy (the flow hold, the bound's verdicts); every
 * link's queue and ring freed with the table (ASan checks). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "fb_links.h"

#include "fake_msg.h"

/* A routing id as the Listener makes them: five bytes, a counter. */
static size_t ident(uint8_t *out, uint32_t k)
{
    out[0] = 0;
    out[1] = (uint8_t)(k >> 24); out[2] = (uint8_t)(k >> 16); out[3] = (uint8_t)(k >> 8); out[4] = (uint8_t)k;
    return 5;
}

static void test_names_found_through_growth_and_tombstones(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    uint8_t id[8];
    enum { N = 5000 };
    for (uint32_t k = 0; k < N; k++) {
        REQUIRE(fb_links_reserve(&t, k) == 0);
        CHECK_EQ(fb_links_name(&t, k, id, ident(id, k)), 0);
    }
    CHECK(t.n >= N);
    CHECK(t.iused * 2 <= t.icap);
    for (uint32_t k = 0; k < N; k++) CHECK_EQ(fb_links_find(&t, id, ident(id, k)), k);
    CHECK_EQ(fb_links_find(&t, id, ident(id, N + 1)), FB_LINK_NONE);
    /* Every other one leaves: the rest are still found past the tombstones. */
    for (uint32_t k = 0; k < N; k += 2) fb_links_unname(&t, k);
    for (uint32_t k = 0; k < N; k++)
        CHECK_EQ(fb_links_find(&t, id, ident(id, k)), k % 2 ? k : FB_LINK_NONE);
    /* Churn: names come and go many times over the index's size; the
     * index is rebuilt without tombstones and never fills (a lookup of a
     * missing id ends). */
    for (uint32_t round = 0; round < 20; round++) {
        for (uint32_t k = 0; k < N; k += 2) {
            CHECK_EQ(fb_links_name(&t, k, id, ident(id, k + (round + 1) * N)), 0);
        }
        for (uint32_t k = 0; k < N; k += 2) fb_links_unname(&t, k);
        CHECK(t.iused * 2 <= t.icap);
    }
    for (uint32_t k = 1; k < N; k += 2) CHECK_EQ(fb_links_find(&t, id, ident(id, k)), k);
    CHECK_EQ(fb_links_find(&t, id, ident(id, 7 * N)), FB_LINK_NONE);
    fb_links_free(&t, &Z);
}

static void test_an_id_named_again_leaves_its_old_link(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    const uint8_t a[] = "peer-a";
    REQUIRE(fb_links_reserve(&t, 3) == 0);
    t.at[1].session = 1;
    CHECK_EQ(fb_links_name(&t, 1, a, 6), 0);
    CHECK_EQ(fb_links_find(&t, a, 6), 1);
    t.at[3].session = 1;
    CHECK_EQ(fb_links_name(&t, 3, a, 6), 0);
    CHECK_EQ(fb_links_find(&t, a, 6), 3);
    CHECK_EQ(t.at[1].session, 0);
    CHECK_EQ(t.at[3].session, 1);
    /* A prefix, or a longer id, is another id. */
    CHECK_EQ(fb_links_find(&t, a, 5), FB_LINK_NONE);
    /* Lengths outside 1..255 and links not reserved are refused, changing nothing. */
    uint8_t big[256] = {0};
    errno = 0;
    CHECK_EQ(fb_links_name(&t, 2, big, 256), -1);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(fb_links_name(&t, 2, big, 0), -1);
    CHECK_EQ(fb_links_name(&t, t.n, a, 6), -1);
    CHECK_EQ(fb_links_find(&t, a, 6), 3);
    CHECK_EQ(fb_links_name(&t, 2, big, 255), 0);
    CHECK_EQ(fb_links_find(&t, big, 255), 2);
    fb_links_free(&t, &Z);
}

static void test_reserve_grows_zeroed_and_refuses_past_the_bound(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    CHECK_EQ(t.n, 64);
    t.at[5].batches_in = 7;
    REQUIRE(fb_links_reserve(&t, 1000) == 0);
    CHECK(t.n > 1000);
    CHECK_EQ(t.at[5].batches_in, 7);
    CHECK_EQ(t.at[999].batches_in, 0);
    CHECK_EQ(t.at[1000].session, 0);
    uint32_t n = t.n;
    errno = 0;
    CHECK_EQ(fb_links_reserve(&t, FB_LINKS_MAX), -1);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(t.n, n);
    fb_links_free(&t, &Z);
}

static void test_blocked_list_and_detached_links(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    CHECK_EQ(fb_links_block(&t, 4), 1);
    CHECK_EQ(fb_links_block(&t, 4), 0);
    CHECK_EQ(fb_links_block(&t, 9), 1);
    t.at[11].detached = 1;
    CHECK_EQ(fb_links_block(&t, 11), 1);            /* marked, not listed */
    CHECK_EQ(t.nblocked, 2);
    CHECK_EQ(t.at[11].blocked, 1);
    CHECK_EQ(fb_links_unblock(&t, 4), 1);
    CHECK_EQ(fb_links_unblock(&t, 4), 0);
    CHECK_EQ(t.nblocked, 1);
    CHECK_EQ(t.blocked[0], 9);
    CHECK_EQ(fb_links_unblock(&t, 11), 1);
    CHECK_EQ(t.nblocked, 1);
    /* Every link blocked at once fits: the list has the table's room. */
    for (uint32_t k = 0; k < t.n; k++) fb_links_block(&t, k);
    CHECK_EQ(t.nblocked, t.n - 1);                  /* 11 is detached */
    for (uint32_t k = 0; k < t.n; k++) fb_links_unblock(&t, k);
    CHECK_EQ(t.nblocked, 0);
    fb_links_free(&t, &Z);
}

static void test_dirty_list_once_a_link_with_a_journal_id(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    fb_links_mark_dirty(&t, 2);                     /* no journal id: not listed */
    CHECK_EQ(t.ndirty, 0);
    t.at[2].jhas = 1;
    fb_links_mark_dirty(&t, 2);
    fb_links_mark_dirty(&t, 2);
    CHECK_EQ(t.ndirty, 1);
    CHECK_EQ(t.dirty[0], 2);
    CHECK_EQ(t.at[2].jdirty, 1);
    fb_links_free(&t, &Z);
}

static void test_events_in_order_one_links_forgotten(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    enum { FLOW = 2, GONE = 4, DETACHED = 6 };
    fb_links_event(&t, GONE, 3, 0);
    fb_links_event(&t, FLOW, 0, 0);
    fb_links_event(&t, DETACHED, 5, 0);
    fb_links_event(&t, GONE, 5, 1);
    fb_links_event(&t, GONE, 7, 2);
    CHECK(fb_links_has_event(&t, DETACHED, 5));
    CHECK(!fb_links_has_event(&t, DETACHED, 3));
    fb_links_forget_events(&t, 5, FLOW);
    CHECK_EQ(t.nevents, 3);
    CHECK_EQ(t.events[0].link, 3);
    CHECK_EQ(t.events[1].kind, FLOW);
    CHECK_EQ(t.events[2].link, 7);
    CHECK_EQ(t.events[2].value, 2);
    fb_links_forget_events(&t, 0, FLOW);            /* link 0's FLOW is the kind kept */
    CHECK_EQ(t.nevents, 3);
    /* The list is bounded by its room: past it, nothing is written. */
    for (uint32_t k = 0; k < 10 * t.n; k++) fb_links_event(&t, GONE, k % t.n, 0);
    CHECK_EQ(t.nevents, 3 * t.n + 1);
    fb_links_free(&t, &Z);
}

static void test_free_closes_every_queue_and_ring(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    REQUIRE(fb_links_reserve(&t, 200) == 0);
    for (uint32_t k = 0; k < 200; k += 7) {
        fb_qentry *e = fb_qentry_new(&Z, 1);
        REQUIRE(e);
        REQUIRE(fb_qentry_frame(&Z, e, 0, "data", 4) == 0);
        e->records = 1;
        fb_linkq_push(&t.at[k].q, e);
        unsigned char *buf = malloc(16);
        REQUIRE(buf);
        memset(buf, 1, 16);
        const uint8_t seq[8] = {0};
        fb_ring_keep(&t.at[k].ring, buf, 16, 1, 1, seq, 1 << 20);
    }
    CHECK(live > 0);
    fb_links_free(&t, &Z);
    CHECK_EQ(live, 0);
    CHECK(t.at == NULL && t.n == 0);
}


/* A data entry of `records` records with a batch of `n` bytes. */
static fb_qentry *data(uint64_t records, size_t n)
{
    static unsigned char zeros[1 << 20];
    fb_qentry *e = fb_qentry_new(&Z, 1);
    REQUIRE(e && n <= sizeof(zeros));
    REQUIRE(fb_qentry_frame(&Z, e, 0, zeros, n) == 0);
    e->records = records;
    return e;
}

static void test_flow_hold_asks_once_and_lets_go_at_a_quarter(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    t.flow_bytes = 10000;
    fb_links_push(&t, 1, data(1, 6000));
    CHECK_EQ(t.nholding, 0);
    CHECK_EQ(t.nevents, 0);
    fb_links_push(&t, 1, data(1, 6000));             /* past flow_bytes: holds, FLOW asked */
    CHECK_EQ(t.at[1].holding, 1);
    CHECK_EQ(t.nholding, 1);
    CHECK_EQ(t.nevents, 1);
    CHECK_EQ(t.events[0].kind, FB_EVENT_FLOW);
    fb_links_push(&t, 2, data(1, 12000));            /* another: counted, the one FLOW stands */
    CHECK_EQ(t.nholding, 2);
    CHECK_EQ(t.nevents, 1);
    t.nevents = 0;                                   /* the owner took its events ... */
    t.flow_asked = 0;
    t.paused = 1;                                    /* ... and paused publishers */
    fb_links_push(&t, 3, data(1, 12000));            /* holds, asks nothing: already paused */
    CHECK_EQ(t.nholding, 3);
    CHECK_EQ(t.nevents, 0);
    /* Draining: still over a quarter holds; at a quarter lets go. */
    fb_linkq_pop(&Z, &t.at[1].q);
    fb_links_drained(&t, 1);
    CHECK_EQ(t.at[1].holding, 1);
    fb_linkq_pop(&Z, &t.at[1].q);
    fb_links_drained(&t, 1);
    CHECK_EQ(t.at[1].holding, 0);
    CHECK_EQ(t.nholding, 2);
    /* Exempt: stops holding and does not again until drained. */
    fb_links_exempt(&t, 2);
    CHECK_EQ(t.at[2].holding, 0);
    CHECK_EQ(t.at[2].exempt, 1);
    CHECK_EQ(t.nholding, 1);
    fb_links_push(&t, 2, data(1, 100));
    CHECK_EQ(t.at[2].holding, 0);
    while (t.at[2].q.head) fb_linkq_pop(&Z, &t.at[2].q);
    fb_links_drained(&t, 2);
    CHECK_EQ(t.at[2].exempt, 0);
    fb_links_push(&t, 2, data(1, 12000));
    CHECK_EQ(t.at[2].holding, 1);
    /* A detached link never holds; release says whether it did. */
    t.at[5].detached = 1;
    fb_links_push(&t, 5, data(1, 12000));
    CHECK_EQ(t.at[5].holding, 0);
    CHECK_EQ(fb_links_release(&t, 3), 1);
    CHECK_EQ(fb_links_release(&t, 3), 0);
    CHECK_EQ(t.nholding, 1);
    /* No flow bound: nothing holds. */
    t.flow_bytes = 0;
    fb_links_push(&t, 6, data(1, 1 << 20));
    CHECK_EQ(t.at[6].holding, 0);
    fb_links_free(&t, &Z);
    CHECK_EQ(live, 0);
}

static void test_bound_drops_oldest_data_or_says_kick(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    t.max_queue = 10000;
    /* Drop the oldest: records counted exactly, the newest kept. */
    t.at[1].session = 1;
    for (int i = 0; i < 5; i++) fb_links_push(&t, 1, data(10 + (uint64_t)i, 3000));
    CHECK_EQ(fb_links_enforce(&t, 1, &Z), FB_KEPT);
    CHECK(t.at[1].q.bytes <= t.max_queue);
    CHECK_EQ(t.at[1].q.lost, t.dropped_slow);
    uint64_t kept = 0;
    for (const fb_qentry *e = t.at[1].q.head; e; e = e->next) kept += e->records;
    CHECK_EQ(kept + t.dropped_slow, 10 + 11 + 12 + 13 + 14);
    CHECK_EQ(t.at[1].q.tail->records, 14);
    /* One batch over the bound by itself (a held link's full outbox) is
     * kept, not taken for control messages the peer does not read. */
    t.at[6].session = 1;
    fb_links_push(&t, 6, data(4096, 30000));
    CHECK_EQ(fb_links_enforce(&t, 6, &Z), FB_KEPT);
    CHECK(t.at[6].q.head != NULL && t.at[6].q.head->records == 4096);
    /* Control messages alone over the bound: a session is to be kicked ... */
    for (int i = 0; i < 5; i++) fb_links_push(&t, 2, data(0, 3000));   /* records 0: control */
    t.at[2].session = 1;
    CHECK_EQ(fb_links_enforce(&t, 2, &Z), FB_KICK_CONTROL);
    /* ... another link is reported once. */
    for (int i = 0; i < 5; i++) fb_links_push(&t, 3, data(0, 3000));
    CHECK_EQ(fb_links_enforce(&t, 3, &Z), FB_KEPT);
    CHECK_EQ(fb_links_enforce(&t, 3, &Z), FB_KEPT);
    CHECK_EQ(t.nevents, 1);
    CHECK_EQ(t.events[0].kind, FB_EVENT_OVERFLOW);
    CHECK_EQ(t.events[0].link, 3);
    /* Policy "disconnect": a session over the bound is to be kicked, its data kept for the owner to drop. */
    t.disconnect = 1;
    uint64_t before = t.dropped_slow;
    t.at[4].session = 1;
    for (int i = 0; i < 5; i++) fb_links_push(&t, 4, data(1, 3000));
    CHECK_EQ(fb_links_enforce(&t, 4, &Z), FB_KICK_SLOW);
    CHECK_EQ(t.dropped_slow, before);
    /* A link without a session under "disconnect" loses its oldest data instead. */
    for (int i = 0; i < 5; i++) fb_links_push(&t, 7, data(1, 3000));
    CHECK_EQ(fb_links_enforce(&t, 7, &Z), FB_KEPT);
    CHECK(t.dropped_slow > before);
    fb_links_free(&t, &Z);
    CHECK_EQ(live, 0);
}

/* A batch of n bytes, as the core allocates them (fb_free frees it). */
static unsigned char *batch(size_t n, unsigned char fill)
{
    unsigned char *b = malloc(n);
    REQUIRE(b);
    memset(b, fill, n);
    return b;
}

static void test_replay_puts_the_ring_past_taken_ahead_and_counts_the_rest_lost(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    fb_link *s = &t.at[3];
    const uint8_t seq1[8] = {1}, seq3[8] = {3}, seq4[8] = {4};
    fb_ring_keep(&s->ring, batch(100, 'a'), 100, 10, 10, seq1, 1 << 20);    /* through 10 */
    fb_ring_keep(&s->ring, NULL, 0, 10, 20, seq1, 1 << 20);                /* a GAP of 10, through 20 */
    fb_ring_keep(&s->ring, batch(200, 'c'), 200, 10, 30, seq3, 1 << 20);   /* through 30 */
    fb_ring_keep(&s->ring, batch(300, 'd'), 300, 15, 45, seq4, 1 << 20);   /* through 45 */
    s->taken = 45;
    fb_links_push(&t, 3, data(5, 50));                                      /* what waited meanwhile */
    size_t waited = t.at[3].q.bytes;
    uint64_t lost = 99;
    uint64_t replayed = fb_links_replay(&t, 3, 10, &Z, &lost);
    CHECK_EQ(replayed, 25);
    CHECK_EQ(lost, 10);
    CHECK_EQ(s->q.lost, 10);
    CHECK_EQ(s->taken, 10);
    CHECK_EQ(s->ring.trimmed, 10);
    CHECK(s->ring.head == NULL);
    /* In order: through 30, through 45, then what waited. */
    fb_qentry *e = s->q.head;
    REQUIRE(e && e->nframes == 3);
    CHECK_EQ(e->records, 10);
    CHECK_EQ(((char *)m_data(&e->frames[0]))[0], 'D');
    CHECK_EQ(((uint8_t *)m_data(&e->frames[1]))[0], 3);
    CHECK_EQ(((fake *)&e->frames[2])->size, 200);
    CHECK_EQ(((unsigned char *)m_data(&e->frames[2]))[199], 'c');
    e = e->next;
    REQUIRE(e);
    CHECK_EQ(e->records, 15);
    CHECK_EQ(((unsigned char *)m_data(&e->frames[2]))[0], 'd');
    e = e->next;
    REQUIRE(e);
    CHECK_EQ(e->records, 5);
    CHECK(e == s->q.tail && e->next == NULL);
    CHECK(s->q.bytes > waited + 500);
    /* A resume from before what the ring let go: one loss of the exact number. */
    fb_links_free(&t, &Z);
    CHECK_EQ(live, 0);

    REQUIRE(fb_links_init(&t) == 0);
    s = &t.at[1];
    fb_ring_keep(&s->ring, batch(100, 'x'), 100, 10, 60, seq1, 1 << 20);   /* records 51..60 */
    s->ring.trimmed = 50;                                                   /* 1..50 let go */
    s->taken = 60;
    replayed = fb_links_replay(&t, 1, 40, &Z, &lost);
    CHECK_EQ(replayed, 10);
    CHECK_EQ(lost, 10);                                                     /* 41..50 */
    CHECK(s->q.head == s->q.tail && s->q.head->records == 10);
    /* Nothing kept past taken: nothing queued, nothing lost. */
    fb_linkq_clear(&Z, &s->q);
    s->q.lost = 0;
    replayed = fb_links_replay(&t, 1, 40, &Z, &lost);
    CHECK_EQ(replayed + lost, 0);
    CHECK(s->q.head == NULL && s->q.tail == NULL);
    fb_links_free(&t, &Z);
    CHECK_EQ(live, 0);
}

/* The hold hook: what it was told, in order. */
static uint32_t held_link[16];
static int held_on[16], nheld;
static void on_hold(void *arg, uint32_t link, int held)
{
    CHECK(arg == (void *)&nheld);
    if (nheld < 16) { held_link[nheld] = link; held_on[nheld] = held; }
    nheld++;
}

static void test_hold_hook_told_of_each_change(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    t.hold = on_hold;
    t.hold_arg = &nheld;
    nheld = 0;
    fb_links_block(&t, 4);
    fb_links_block(&t, 4);                           /* no change: not told */
    fb_links_unblock(&t, 4);
    fb_links_unblock(&t, 4);
    CHECK_EQ(nheld, 2);
    CHECK(held_link[0] == 4 && held_on[0] == 1 && held_on[1] == 0);
    fb_links_free(&t, &Z);
}

static void test_lose_detaches_a_resumable_session_and_resets_any_other(void)
{
    fb_links t;
    REQUIRE(fb_links_init(&t) == 0);
    t.hold = on_hold;
    t.hold_arg = &nheld;
    t.flow_bytes = 1000;
    /* A resumable session holding publishers back loses its connection:
     * detached (held, not listed), no longer holding (FLOW asked), its
     * queue kept, one DETACHED however often it is lost. */
    fb_link *s = &t.at[2];
    s->session = 1;
    s->resumable = 1;
    fb_links_push(&t, 2, data(3, 2000));
    fb_links_block(&t, 2);
    CHECK_EQ(t.at[2].holding, 1);
    t.nevents = 0;
    t.flow_asked = 0;
    nheld = 0;
    fb_links_lose(&t, 2, FB_EVENT_GONE, 0, &Z);
    fb_links_lose(&t, 2, FB_EVENT_GONE, 0, &Z);
    CHECK_EQ(s->gone, 0);
    CHECK_EQ(s->detached, 1);
    CHECK_EQ(s->blocked, 1);
    CHECK_EQ(t.nblocked, 0);
    CHECK_EQ(s->holding, 0);
    CHECK_EQ(t.nholding, 0);
    CHECK(s->q.head != NULL);
    CHECK_EQ(t.nevents, 2);
    CHECK_EQ(t.events[0].kind, FB_EVENT_FLOW);
    CHECK_EQ(t.events[1].kind, FB_EVENT_DETACHED);
    CHECK(nheld >= 1 && held_on[nheld - 1] == 1);   /* still held at the end */
    /* Its queue started over: empty, unblocked, its events gone but FLOW. */
    nheld = 0;
    fb_links_reset(&t, 2, &Z);
    CHECK(s->q.head == NULL && s->q.bytes == 0);
    CHECK_EQ(s->detached, 0);
    CHECK_EQ(s->blocked, 0);
    CHECK_EQ(nheld, 1);
    CHECK_EQ(held_on[0], 0);
    CHECK_EQ(t.nevents, 1);
    CHECK_EQ(t.events[0].kind, FB_EVENT_FLOW);
    /* Another link, disconnected as slow: reset, gone, reported once. */
    fb_link *o = &t.at[3];
    o->session = 1;
    fb_links_push(&t, 3, data(2, 100));
    fb_links_block(&t, 3);
    o->q.lost = 7;
    fb_links_lose(&t, 3, FB_EVENT_SLOW, 1, &Z);
    fb_links_lose(&t, 3, FB_EVENT_GONE, 0, &Z);
    CHECK_EQ(o->gone, 1);
    CHECK(o->q.head == NULL && o->q.lost == 0);
    CHECK_EQ(o->blocked, 0);
    CHECK_EQ(t.nevents, 2);
    CHECK_EQ(t.events[1].kind, FB_EVENT_SLOW);
    CHECK_EQ(t.events[1].link, 3);
    CHECK_EQ(t.events[1].value, 1);
    /* A link past the table: reset does nothing. */
    fb_links_reset(&t, t.n + 5, &Z);
    fb_links_free(&t, &Z);
    CHECK_EQ(live, 0);
}

int main(void)
{
    RUN(test_names_found_through_growth_and_tombstones);
    RUN(test_an_id_named_again_leaves_its_old_link);
    RUN(test_reserve_grows_zeroed_and_refuses_past_the_bound);
    RUN(test_blocked_list_and_detached_links);
    RUN(test_dirty_list_once_a_link_with_a_journal_id);
    RUN(test_events_in_order_one_links_forgotten);
    RUN(test_flow_hold_asks_once_and_lets_go_at_a_quarter);
    RUN(test_bound_drops_oldest_data_or_says_kick);
    RUN(test_replay_puts_the_ring_past_taken_ahead_and_counts_the_rest_lost);
    RUN(test_hold_hook_told_of_each_change);
    RUN(test_lose_detaches_a_resumable_session_and_resets_any_other);
    RUN(test_free_closes_every_queue_and_ring);
    CTEST_END();
}
