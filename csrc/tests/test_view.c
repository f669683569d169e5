/* test_view.c - the publisher's view (fb_view.h): WANT snapshots and
 * diffs, refusal of malformed ops, and when an ACK is due. */
#include <string.h>

#include "ctest.h"
#include "fb_view.h"

/* An ops batch (docs/BATCH_FORMAT.md): keys with one flags byte each. */
typedef struct { unsigned char b[4096]; size_t len; uint32_t count; } ops;

static void ops_start(ops *o)
{
    memcpy(o->b, "FB\x01\x00\x00\x00\x00\x00", 8);
    o->len = 8;
    o->count = 0;
}

static void ops_add(ops *o, const char *key, unsigned flags)
{
    size_t k = strlen(key);
    REQUIRE(k < 128 && o->len + k + 3 < sizeof o->b);
    o->b[o->len++] = (unsigned char)k;
    o->b[o->len++] = 1;
    memcpy(o->b + o->len, key, k);
    o->len += k;
    o->b[o->len++] = (unsigned char)flags;
    o->count++;
    memcpy(o->b + 4, &o->count, 4);
}

#define SUB FB_OP_F_SUBSCRIBE
#define PFX FB_OP_F_PREFIX

static int wanted(fb_view *v, const char *topic) { return fb_view_match(v, topic, strlen(topic)); }

static void test_reset_then_diffs(void)
{
    fb_view v;
    fb_view_init(&v);
    ops o;
    uint64_t ack = 99;
    CHECK_EQ(wanted(&v, "a"), -1);                         /* no view: everything goes */
    ops_start(&o);
    ops_add(&o, "x", 0);                                   /* a diff before any snapshot: ignored */
    CHECK_EQ(fb_view_apply(&v, 0, o.b, o.len, 0, 0, 0, &ack), FB_OK);
    CHECK_EQ(ack, 0);
    CHECK_EQ(wanted(&v, "a"), -1);

    ops_start(&o);
    ops_add(&o, "room.1", SUB);
    ops_add(&o, "news.", SUB | PFX);
    ops_add(&o, "ignored", 0);                             /* an unsubscribe in a snapshot */
    CHECK_EQ(fb_view_apply(&v, FB_WANT_RESET, o.b, o.len, 0, 0, 0, &ack), FB_OK);
    CHECK_EQ(wanted(&v, "room.1"), 1);
    CHECK_EQ(wanted(&v, "room.2"), 0);
    CHECK_EQ(wanted(&v, "news.sport"), 1);
    CHECK_EQ(wanted(&v, "ignored"), 0);

    ops_start(&o);
    ops_add(&o, "room.2", SUB);
    ops_add(&o, "news.", PFX);                             /* unsubscribe the prefix */
    ops_add(&o, "never.held", 0);                          /* removing what is not held: ignored */
    CHECK_EQ(fb_view_apply(&v, 0, o.b, o.len, 0, 0, 0, &ack), FB_OK);
    CHECK_EQ(wanted(&v, "room.2"), 1);
    CHECK_EQ(wanted(&v, "news.sport"), 0);
    CHECK_EQ(v.wants, 3);

    ops_start(&o);                                         /* a new snapshot replaces the view */
    ops_add(&o, "only", SUB);
    CHECK_EQ(fb_view_apply(&v, FB_WANT_RESET | 0x80, o.b, o.len, 0, 0, 0, &ack), FB_OK);
    CHECK_EQ(wanted(&v, "room.1"), 0);
    CHECK_EQ(wanted(&v, "only"), 1);

    fb_view_forget(&v);                                    /* a new session */
    CHECK_EQ(wanted(&v, "room.1"), -1);
    fb_view_free(&v);
}

static void test_malformed_ops_leave_the_view_as_it_was(void)
{
    fb_view v;
    fb_view_init(&v);
    ops o;
    uint64_t ack;
    ops_start(&o);
    ops_add(&o, "keep", SUB);
    CHECK_EQ(fb_view_apply(&v, FB_WANT_RESET, o.b, o.len, 1, 1, 0, &ack), FB_OK);

    ops_start(&o);
    ops_add(&o, "bad", 0x80);                              /* unknown op bits */
    CHECK_EQ(fb_view_apply(&v, FB_WANT_RESET, o.b, o.len, 1, 2, 0, &ack), FB_EMALFORMED);
    /* A well-formed batch whose record's flags are two bytes. */
    unsigned char two[15] = {'F', 'B', 1, 0, 1, 0, 0, 0, 3, 2, 't', 'w', 'o', SUB, 0};
    CHECK(fb_view_apply(&v, 0, two, sizeof two, 1, 3, 0, &ack) < 0);   /* over the decoder's limit */
    unsigned char huge[12] = {'F', 'B', 1, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    CHECK(fb_view_apply(&v, 0, huge, sizeof huge, 1, 4, 0, &ack) < 0);   /* a count no frame holds */
    CHECK(fb_view_apply(&v, 0, "nonsense", 8, 1, 5, 0, &ack) < 0);
    CHECK_EQ(wanted(&v, "keep"), 1);
    CHECK_EQ(v.applied, 1);                                /* a refused WANT is not acknowledged */
    fb_view_free(&v);
}

static void test_acks_within_the_lease_and_when_the_next_one_comes(void)
{
    fb_view v;
    fb_view_init(&v);
    ops o;
    uint64_t ack;
    ops_start(&o);
    ops_add(&o, "a", SUB);
    /* No lease yet: applied, not acknowledged now. */
    CHECK_EQ(fb_view_apply(&v, FB_WANT_RESET, o.b, o.len, 1, 1, 1000, &ack), FB_OK);
    CHECK_EQ(ack, 0);
    CHECK_EQ(fb_view_grant(&v, 5000), 1);                  /* the lease says it */
    fb_view_acked(&v, 1);
    CHECK_EQ(fb_view_grant(&v, 4000), 0);                  /* nothing new; a shorter one is no change */
    CHECK_EQ(fb_view_apply(&v, 0, o.b, o.len, 1, 2, 4999, &ack), FB_OK);
    CHECK_EQ(ack, 2);                                      /* within it: at once */
    fb_view_acked(&v, 2);
    CHECK_EQ(fb_view_apply(&v, 0, o.b, o.len, 1, 3, 5000, &ack), FB_OK);
    CHECK_EQ(ack, 0);                                      /* past it */
    CHECK_EQ(fb_view_grant(&v, 9000), 3);
    fb_view_acked(&v, 3);
    fb_view_acked(&v, 2);                                  /* an older ACK leaving late */
    CHECK_EQ(v.acked, 3);
    fb_view_forget(&v);
    CHECK_EQ(v.applied, 0);
    CHECK_EQ(fb_view_grant(&v, 9000), 0);
    fb_view_free(&v);
}

static void test_the_lease_counts_renews_once_and_never_shrinks(void)
{
    fb_view v;
    fb_view_init(&v);
    CHECK(fb_view_in_lease(&v, 12345));                    /* no broker said otherwise: for ever */
    fb_view_forget(&v);                                    /* a new session: none until granted */
    CHECK(!fb_view_in_lease(&v, 0));
    /* 100 ms granted for what left at t=1 s: 90 ms counted, renewal from 45 ms. */
    CHECK_EQ(fb_view_lease(&v, 1000000000ull, 100000), 0);
    CHECK(fb_view_in_lease(&v, 1089999999ull));
    CHECK(!fb_view_in_lease(&v, 1090000000ull));
    CHECK_EQ(fb_view_ask_renewal(&v, 1044999999ull, 0), 0);  /* not yet */
    CHECK_EQ(fb_view_ask_renewal(&v, 1045000000ull, 0), 1);
    CHECK_EQ(fb_view_ask_renewal(&v, 1050000000ull, 0), 0);  /* asked once, until answered */
    CHECK_EQ(fb_view_ask_renewal(&v, 1050000000ull, 1), 0);
    CHECK_EQ(fb_view_take_renewal(&v), 1);                 /* the sender takes it... */
    CHECK_EQ(fb_view_take_renewal(&v), 0);
    fb_view_renewal_unsent(&v);                            /* ...cannot send it now... */
    CHECK_EQ(fb_view_take_renewal(&v), 1);                 /* ...and takes it again */
    CHECK_EQ(fb_view_ask_renewal(&v, 1050000000ull, 0), 0);
    /* An older ping's answer does not shorten the lease, but answers. */
    fb_view_lease(&v, 900000000ull, 100000);
    CHECK(fb_view_in_lease(&v, 1089999999ull));
    CHECK_EQ(fb_view_ask_renewal(&v, 1050000000ull, 0), 1);
    CHECK_EQ(fb_view_take_renewal(&v), 1);
    fb_view_lease(&v, 1050000000ull, 100000);
    CHECK(fb_view_in_lease(&v, 1139999999ull));
    CHECK_EQ(fb_view_ask_renewal(&v, 1094999999ull, 0), 0);
    CHECK_EQ(fb_view_ask_renewal(&v, 1095000000ull, 0), 1);
    fb_view_renewal_answered(&v);                          /* answered without a lease: ask again */
    CHECK_EQ(fb_view_ask_renewal(&v, 1095000000ull, 0), 1);
    CHECK_EQ(v.leases, 3);
    /* A lease from the network too long to count in ns is bounded. */
    fb_view_lease(&v, 2000000000ull, UINT64_MAX);
    CHECK(fb_view_in_lease(&v, 2000000000ull + FB_VIEW_LEASE_MAX_US * 900 - 1));
    CHECK(!fb_view_in_lease(&v, 2000000000ull + FB_VIEW_LEASE_MAX_US * 900));
    fb_view_set_lease(&v, UINT64_MAX);                     /* a broker that grants none */
    CHECK(fb_view_in_lease(&v, UINT64_MAX - 1));
    CHECK_EQ(fb_view_ask_renewal(&v, UINT64_MAX - 1, 0), 0);
    fb_view_free(&v);
}

static void test_a_lease_acknowledges_what_was_applied_outside_the_last(void)
{
    fb_view v;
    fb_view_init(&v);
    ops o;
    uint64_t ack = 99;
    fb_view_forget(&v);
    ops_start(&o);
    ops_add(&o, "a", SUB);
    CHECK_EQ(fb_view_apply(&v, FB_WANT_RESET, o.b, o.len, 1, 7, 5000, &ack), FB_OK);
    CHECK_EQ(ack, 0);                                      /* no lease: not acknowledged now */
    CHECK_EQ(fb_view_lease(&v, 6000, 100), 7);             /* the next lease says it */
    fb_view_acked(&v, 7);
    CHECK_EQ(fb_view_apply(&v, 0, o.b, o.len, 1, 8, 6000 + 2 * 100 * 1000 - 1, &ack), FB_OK);
    CHECK_EQ(ack, 8);                                      /* within twice the lease from the ping */
    fb_view_free(&v);
}

static void test_a_zero_lease_grants_nothing_and_the_lease_is_read_with_the_view(void)
{
    fb_view v;
    fb_view_init(&v);
    ops o;
    uint64_t ack, until = 1;
    fb_view_forget(&v);
    ops_start(&o);
    ops_add(&o, "a", SUB);
    CHECK_EQ(fb_view_apply(&v, FB_WANT_RESET, o.b, o.len, 1, 1, 1000, &ack), FB_OK);
    CHECK_EQ(fb_view_match_lease(&v, "b", 1, &until), 0);
    CHECK_EQ(until, 0);                                    /* no lease yet */
    fb_view_lease(&v, 1000000000ull, 100000);
    CHECK_EQ(fb_view_match_lease(&v, "a", 1, &until), 1);
    CHECK_EQ(until, 1090000000ull);
    /* A downstream broker whose own lease ran out grants 0: nothing, not a
     * lease until the ping's send time. */
    fb_view_lease(&v, 2000000000ull, 0);
    CHECK(!fb_view_in_lease(&v, 1999999999ull));
    CHECK_EQ(fb_view_match_lease(&v, "b", 1, &until), 0);
    CHECK_EQ(until, 1090000000ull);
    CHECK_EQ(v.renew, FB_VIEW_RENEW_NONE);                 /* answered: may ask again */
    fb_view_free(&v);
}

int main(void)
{
    RUN(test_reset_then_diffs);
    RUN(test_malformed_ops_leave_the_view_as_it_was);
    RUN(test_acks_within_the_lease_and_when_the_next_one_comes);
    RUN(test_the_lease_counts_renews_once_and_never_shrinks);
    RUN(test_a_lease_acknowledges_what_was_applied_outside_the_last);
    RUN(test_a_zero_lease_grants_nothing_and_the_lease_is_read_with_the_view);
    CTEST_END();
}
