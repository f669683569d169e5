/* test_burst.c - the burst rule and the linger (fb_burst.h), on a clock
 * the test gives. */
#include "ctest.h"
#include "fb_burst.h"

#define MS 1000000ull

static void test_an_idle_publisher_sends_at_once_until_a_burst(void)
{
    fb_burst b;
    fb_burst_init(&b, 10 * MS, 2);
    uint64_t t = 1000 * MS;
    CHECK(fb_burst_starts_idle(&b, t));             /* nothing sent yet */
    fb_burst_sent(&b, 0, t);
    CHECK(fb_burst_starts_idle(&b, t + 1 * MS));    /* one within the gap: idle still */
    fb_burst_sent(&b, 0, t + 1 * MS);
    CHECK_EQ(b.streak, 2);
    CHECK(!fb_burst_starts_idle(&b, t + 2 * MS));   /* burst_limit reached: the sender's */
    CHECK(!fb_burst_idle(&b, t + 2 * MS));
    CHECK(fb_burst_idle(&b, t + 11 * MS));          /* the gap passed */
    CHECK(fb_burst_starts_idle(&b, t + 11 * MS));
    CHECK_EQ(b.streak, 0);                          /* and the streak starts again */
    fb_burst_sent(&b, 0, t + 11 * MS);
    CHECK_EQ(b.streak, 1);
}

static void test_a_full_or_threaded_send_marks_it_busy(void)
{
    fb_burst b;
    fb_burst_init(&b, 10 * MS, 4);
    uint64_t t = 1000 * MS;
    fb_burst_sent(&b, 1, t);
    CHECK_EQ(b.streak, 4);
    CHECK(!fb_burst_starts_idle(&b, t + 9 * MS));
    CHECK(fb_burst_starts_idle(&b, t + 10 * MS));
    /* A clock read before another thread's send counts as after the gap. */
    fb_burst_sent(&b, 1, t + 20 * MS);
    CHECK(fb_burst_idle(&b, t + 19 * MS));
    fb_burst_init(&b, 10 * MS, 0);                  /* no burst allowed: never idle within a gap */
    fb_burst_sent(&b, 0, t);
    CHECK(!fb_burst_idle(&b, t + 1 * MS));
    fb_burst_init(&b, 10 * MS, -3);                 /* (a negative limit is none) */
    CHECK_EQ(b.burst_limit, 0);
}

static void test_the_linger(void)
{
    fb_burst b;
    fb_burst_init(&b, 10 * MS, 4);
    uint64_t t = 1000 * MS;
    CHECK_EQ(fb_burst_linger_due(&b, 5 * MS, t), 0);        /* nothing sent yet: now */
    fb_burst_sent(&b, 0, t);
    CHECK_EQ(fb_burst_linger_due(&b, 5 * MS, t + 1 * MS), t + 5 * MS);
    CHECK_EQ(fb_burst_linger_due(&b, 5 * MS, t + 5 * MS), 0);
    CHECK_EQ(fb_burst_linger_due(&b, 0, t + 1 * MS), 0);    /* no linger */
}

int main(void)
{
    RUN(test_an_idle_publisher_sends_at_once_until_a_burst);
    RUN(test_a_full_or_threaded_send_marks_it_busy);
    RUN(test_the_linger);
    CTEST_END();
}
