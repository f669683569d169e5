/* test_linkq.c - a link's send queue (fb_linkq.h): byte accounting, data
 * dropped oldest first and counted exactly, control messages kept, WANT
 * and FLOW collapsed into one mark each.  Messages are a test's own
 * (malloc'd), so ASan sees every one closed once. */
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "fb_linkq.h"
#include "fb_protocol.h"

#include "fake_msg.h"

/* A data entry of `records` records and a batch of `n` bytes. */
static fb_qentry *data_entry(uint64_t records, size_t n)
{
    fb_qentry *e = fb_qentry_new(&Z, 3);
    static unsigned char batch[8192];
    memset(batch, 'x', sizeof batch);
    REQUIRE(e != NULL && n <= sizeof batch);
    CHECK_EQ(fb_qentry_frame(&Z, e, 0, FB_CMD_DATA_S, 1), 0);
    CHECK_EQ(fb_qentry_frame(&Z, e, 1, "12345678", 8), 0);
    CHECK_EQ(fb_qentry_frame(&Z, e, 2, batch, n), 0);
    e->records = records;
    return e;
}

static fb_qentry *control(uint8_t cmd)
{
    fb_qentry *e = fb_qentry_new(&Z, 2);
    char c = (char)cmd;
    CHECK(e != NULL);
    CHECK_EQ(fb_qentry_frame(&Z, e, 0, &c, 1), 0);
    CHECK_EQ(fb_qentry_frame(&Z, e, 1, "x", 1), 0);
    e->cmd = cmd;
    return e;
}

static void test_bytes_counted_and_popped_in_order(void)
{
    fb_linkq q = {0};
    fb_qentry *a = data_entry(2, 100), *b = control(FB_CMD_GAP);
    CHECK_EQ(a->size, FB_Q_ENTRY_BYTES + 1 + 8 + 100);
    fb_linkq_push(&q, a);
    fb_linkq_push(&q, b);
    CHECK_EQ(q.bytes, a->size + b->size);
    CHECK(q.head == a && q.tail == b);
    CHECK_EQ(live, 5);
    fb_linkq_pop(&Z, &q);
    CHECK(q.head == b && q.tail == b);
    CHECK_EQ(q.bytes, FB_Q_ENTRY_BYTES + 2);
    fb_linkq_clear(&Z, &q);
    CHECK(q.head == NULL && q.tail == NULL && q.bytes == 0);
    CHECK_EQ(live, 0);
}

static void test_data_dropped_oldest_first_control_kept(void)
{
    fb_linkq q = {0};
    fb_linkq_push(&q, data_entry(10, 500));
    fb_linkq_push(&q, control(FB_CMD_CONFIRM));
    fb_linkq_push(&q, data_entry(20, 500));
    fb_qentry *sending = data_entry(30, 500);
    fb_linkq_push(&q, sending);
    fb_linkq_push(&q, data_entry(40, 500));
    sending->done = 1;                              /* partly sent: stays whole */
    size_t entry = sending->size;
    /* Room for the control message and two data entries. */
    uint64_t dropped = fb_linkq_drop_data(&Z, &q, FB_Q_ENTRY_BYTES + 2 + 2 * entry);
    CHECK_EQ(dropped, 30);                          /* 10 and 20, the oldest not being sent */
    CHECK_EQ(q.lost, 30);
    CHECK_EQ(q.head->cmd, FB_CMD_CONFIRM);
    CHECK(q.head->next == sending);
    CHECK_EQ(q.tail->records, 40);
    CHECK_EQ(q.bytes, FB_Q_ENTRY_BYTES + 2 + 2 * entry);
    /* Nothing left to drop: what is being sent, the control message and
     * the newest batch stay (a consumer that falls behind gets the newest). */
    dropped = fb_linkq_drop_data(&Z, &q, 0);
    CHECK_EQ(dropped, 0);
    CHECK_EQ(q.lost, 30);
    CHECK_EQ(q.tail->records, 40);
    CHECK(q.head->next == sending && sending->next == q.tail);
    fb_linkq_clear(&Z, &q);
    CHECK_EQ(q.lost, 0);
    CHECK_EQ(live, 0);
}

static void test_a_batch_over_the_bound_by_itself_is_the_one_kept(void)
{
    /* A held link's batch grows to the outbox's limit, which may be over
     * the queue's bound: what was queued before goes, the newest stays. */
    fb_linkq q = {0};
    fb_linkq_push(&q, data_entry(5, 100));
    fb_linkq_push(&q, data_entry(7, 100));
    fb_linkq_push(&q, data_entry(4096, 5000));
    uint64_t dropped = fb_linkq_drop_data(&Z, &q, 1000);
    CHECK_EQ(dropped, 12);
    CHECK_EQ(q.lost, 12);
    CHECK(q.head == q.tail && q.head->records == 4096);
    fb_linkq_clear(&Z, &q);
    CHECK_EQ(live, 0);
}

static void test_wants_and_flows_collapse_into_one_mark_each(void)
{
    fb_linkq q = {0};
    fb_linkq_push(&q, data_entry(1, 10));
    fb_linkq_push(&q, control(FB_CMD_WANT));
    fb_linkq_push(&q, control(FB_CMD_CONFIRM));
    fb_linkq_push(&q, control(FB_CMD_WANT));
    fb_linkq_push(&q, control(FB_CMD_FLOW));
    size_t before = q.bytes;
    CHECK(fb_linkq_collapse(&Z, &q, FB_CMD_WANT, FB_Q_MARK_WANT, FB_Q_WANT_MARK));
    /* The first WANT became the mark in its place, the second went. */
    fb_qentry *m = q.head->next;
    CHECK_EQ(m->kind, FB_Q_WANT_MARK);
    CHECK_EQ(m->nframes, 0);
    CHECK_EQ(m->size, FB_Q_ENTRY_BYTES);
    CHECK_EQ(m->next->cmd, FB_CMD_CONFIRM);
    CHECK_EQ(m->next->next->cmd, FB_CMD_FLOW);
    CHECK_EQ(q.bytes, before - 2 - (FB_Q_ENTRY_BYTES + 2));
    CHECK_EQ(q.marks, FB_Q_MARK_WANT);
    /* Once marked, another changes nothing. */
    before = q.bytes;
    CHECK(fb_linkq_collapse(&Z, &q, FB_CMD_WANT, FB_Q_MARK_WANT, FB_Q_WANT_MARK));
    CHECK_EQ(q.bytes, before);
    /* A FLOW queued: its mark where it was. */
    CHECK(fb_linkq_collapse(&Z, &q, FB_CMD_FLOW, FB_Q_MARK_FLOW, FB_Q_FLOW_MARK));
    CHECK_EQ(q.tail->kind, FB_Q_FLOW_MARK);
    CHECK_EQ(q.marks, FB_Q_MARK_WANT | FB_Q_MARK_FLOW);
    fb_linkq_clear(&Z, &q);
    /* None of its kind queued: a new mark at the end. */
    fb_linkq_push(&q, data_entry(1, 10));
    CHECK(fb_linkq_collapse(&Z, &q, FB_CMD_WANT, FB_Q_MARK_WANT, FB_Q_WANT_MARK));
    CHECK_EQ(q.tail->kind, FB_Q_WANT_MARK);
    CHECK(q.head != q.tail);
    CHECK_EQ(q.bytes, q.head->size + FB_Q_ENTRY_BYTES);
    fb_linkq_clear(&Z, &q);
    CHECK_EQ(live, 0);
}

static void test_entries_of_no_and_many_frames(void)
{
    CHECK(fb_qentry_new(&Z, -1) == NULL);
    CHECK(fb_qentry_new(&Z, 256) == NULL);
    fb_qentry *e = fb_qentry_new(&Z, 0);
    CHECK(e != NULL && e->nframes == 0);
    fb_qentry_free(&Z, e);
    e = fb_qentry_new(&Z, 8);
    for (int i = 0; i < 8; i++) CHECK_EQ(fb_qentry_frame(&Z, e, i, "abc", 3), 0);
    CHECK_EQ(fb_qentry_frame(&Z, e, 3, "", 0), 0);   /* replaced: the old one closed */
    CHECK_EQ(e->size, FB_Q_ENTRY_BYTES + 8 * 3);
    CHECK_EQ(live, 8);
    fb_qentry_free(&Z, e);
    CHECK_EQ(live, 0);
}

int main(void)
{
    RUN(test_bytes_counted_and_popped_in_order);
    RUN(test_data_dropped_oldest_first_control_kept);
    RUN(test_a_batch_over_the_bound_by_itself_is_the_one_kept);
    RUN(test_wants_and_flows_collapse_into_one_mark_each);
    RUN(test_entries_of_no_and_many_frames);
    CTEST_END();
}
