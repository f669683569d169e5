/* test_ring.c - what a resumable session was sent, kept for a resume
 * (fb_ring.h): the byte bound, the exact count of what was let go, the
 * client's TAKEN, and a resume moving the batches out (under ASan: nothing
 * leaked, nothing freed twice). */
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "fb_ring.h"

static const uint8_t SEQ[8] = {1, 2, 3, 4, 5, 6, 7, 8};

/* A batch of n bytes, as the core allocates them (fb_free frees it). */
static unsigned char *batch(size_t n, unsigned char fill)
{
    unsigned char *b = malloc(n);
    memset(b, fill, n);
    return b;
}

static size_t count(const fb_ring *r)
{
    size_t n = 0;
    for (const fb_ring_entry *e = r->head; e; e = e->next) n++;
    return n;
}

static void test_kept_in_order_and_trimmed_by_taken(void)
{
    fb_ring r = {0};
    fb_ring_keep(&r, batch(100, 'a'), 100, 10, 10, SEQ, 1 << 20);
    fb_ring_keep(&r, NULL, 0, 5, 15, SEQ, 1 << 20);              /* a GAP of 5 */
    fb_ring_keep(&r, batch(50, 'b'), 50, 3, 18, SEQ, 1 << 20);
    CHECK_EQ(count(&r), 3);
    CHECK_EQ(r.bytes, 100 + 50 + 3 * FB_RING_ENTRY_BYTES);
    CHECK_EQ(r.head->end, 10);
    CHECK(r.head->next->buf == NULL && r.head->next->records == 5);
    CHECK_EQ(memcmp(r.tail->seq, SEQ, 8), 0);
    fb_ring_trim(&r, 9);                                         /* covers nothing whole */
    CHECK_EQ(count(&r), 3);
    CHECK_EQ(r.trimmed, 0);
    fb_ring_trim(&r, 15);                                        /* the batch and the GAP */
    CHECK_EQ(count(&r), 1);
    CHECK_EQ(r.trimmed, 15);
    CHECK_EQ(r.bytes, 50 + FB_RING_ENTRY_BYTES);
    fb_ring_trim(&r, 100);
    CHECK(r.head == NULL && r.tail == NULL);
    CHECK_EQ(r.bytes, 0);
    CHECK_EQ(r.trimmed, 18);
    fb_ring_clear(&r);
}

static void test_the_bound_lets_the_oldest_go_and_counts_them(void)
{
    fb_ring r = {0};
    size_t limit = 3 * (100 + FB_RING_ENTRY_BYTES);
    for (uint64_t i = 1; i <= 10; i++)
        fb_ring_keep(&r, batch(100, (unsigned char)i), 100, 1, i, SEQ, limit);
    CHECK_EQ(count(&r), 3);                                      /* the newest three */
    CHECK_EQ(r.head->end, 8);
    CHECK_EQ(r.head->buf[0], 8);
    CHECK_EQ(r.trimmed, 7);                                      /* a resume from before: GAP of what went */
    CHECK(r.bytes <= limit);
    /* One batch over the bound by itself stays (the newest always does). */
    fb_ring_keep(&r, batch(5000, 'x'), 5000, 100, 110, SEQ, limit);
    CHECK_EQ(count(&r), 1);
    CHECK_EQ(r.trimmed, 10);
    CHECK_EQ(r.tail->end, 110);
    fb_ring_clear(&r);
    CHECK_EQ(r.trimmed, 0);
    CHECK(r.head == NULL && r.bytes == 0);
}

static void test_a_resume_moves_the_batches_out(void)
{
    fb_ring r = {0};
    fb_ring_keep(&r, batch(10, 'a'), 10, 2, 2, SEQ, 1 << 20);
    fb_ring_keep(&r, batch(20, 'b'), 20, 2, 4, SEQ, 1 << 20);
    fb_ring_keep(&r, NULL, 0, 1, 5, SEQ, 1 << 20);
    unsigned char *moved = NULL;
    fb_ring_entry *e;
    int n = 0;
    while ((e = fb_ring_detach(&r)) != NULL) {
        CHECK(e->next == NULL);
        if (e->end == 4) {                      /* its batch moves on: no copy */
            moved = e->buf;
            e->buf = NULL;
        }
        fb_ring_entry_free(e);
        n++;
    }
    CHECK_EQ(n, 3);
    CHECK(r.head == NULL && r.tail == NULL && r.bytes == 0);
    CHECK_EQ(r.trimmed, 0);                     /* the caller says where the stream restarts */
    CHECK(moved != NULL && moved[0] == 'b');
    free(moved);
    fb_ring_forget(&r, 3);
    CHECK_EQ(r.trimmed, 3);
    CHECK(fb_ring_detach(&r) == NULL);
}

static void test_forget_lets_everything_go(void)
{
    fb_ring r = {0};
    fb_ring_keep(&r, batch(10, 'a'), 10, 2, 2, SEQ, 1 << 20);
    fb_ring_keep(&r, batch(10, 'b'), 10, 2, 4, SEQ, 1 << 20);
    fb_ring_forget(&r, 9);
    CHECK(r.head == NULL && r.bytes == 0);
    CHECK_EQ(r.trimmed, 9);
    fb_ring_keep(&r, batch(10, 'c'), 10, 1, 10, SEQ, 1 << 20);  /* and keeps again after */
    CHECK_EQ(count(&r), 1);
    CHECK_EQ(r.trimmed, 9);
    fb_ring_clear(&r);
}

int main(void)
{
    RUN(test_kept_in_order_and_trimmed_by_taken);
    RUN(test_the_bound_lets_the_oldest_go_and_counts_them);
    RUN(test_a_resume_moves_the_batches_out);
    RUN(test_forget_lets_everything_go);
    CTEST_END();
}
