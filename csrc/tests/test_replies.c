/* Tests of fb_replies: requests matched to their replies by id. */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "ctest.h"
#include "fb_outbox.h"
#include "fb_replies.h"

#define PREFIX "_INBOX.c1."

/* A batch of replies: channels PREFIX + ids[i] (or the literal topic when
 * ids[i] is 0), payload "r<id>"; no_resp[i]: the broker's 503 instead. */
static unsigned char *replies_of(const uint64_t *ids, const char **topics, const int *no_resp, int n, size_t *len)
{
    static const unsigned char status[] = { 7, ':', 's', 't', 'a', 't', 'u', 's', 3, '5', '0', '3' };
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    for (int i = 0; i < n; i++) {
        char topic[64], payload[32];
        int tl = ids[i] ? snprintf(topic, sizeof topic, PREFIX "%llu", (unsigned long long)ids[i])
                        : snprintf(topic, sizeof topic, "%s", topics[i]);
        int pl = snprintf(payload, sizeof payload, "r%llu", (unsigned long long)ids[i]);
        if (no_resp && no_resp[i])
            REQUIRE(fb_outbox_append_h(&o, topic, (size_t)tl, status, sizeof status, NULL, 0, 0) >= 0);
        else
            REQUIRE(fb_outbox_append_h(&o, topic, (size_t)tl, NULL, 0, payload, (size_t)pl, 0) >= 0);
    }
    unsigned char *b;
    REQUIRE(fb_outbox_take(&o, &b, len) == FB_OK);
    fb_outbox_destroy(&o);
    return b;
}

static void test_matched_by_id(void)
{
    fb_replies *t = fb_replies_new(PREFIX, sizeof PREFIX - 1, 16);
    REQUIRE(t);
    uint64_t a, b, c;
    CHECK_EQ(fb_replies_open(t, 0, &a), FB_OK);
    CHECK_EQ(fb_replies_open(t, 0, &b), FB_OK);
    CHECK_EQ(fb_replies_open(t, 0, &c), FB_OK);
    CHECK(a != b && b != c);
    /* c's reply, b's no-responders, a stranger, a second reply to c,
     * a channel that is not an id: two matched. */
    uint64_t ids[] = { c, b, 999, c, 0, 0 };
    const char *topics[] = { NULL, NULL, NULL, NULL, PREFIX "x1", PREFIX "01" };
    int no_resp[] = { 0, 1, 0, 0, 0, 0 };
    size_t len;
    unsigned char *batch = replies_of(ids, topics, no_resp, 6, &len);
    CHECK_EQ(fb_replies_take(t, batch, len), 2);
    CHECK_EQ(fb_replies_state(t, a), FB_REPLY_WAITING);
    CHECK_EQ(fb_replies_wait(t, c, 0), FB_REPLY_DONE);
    CHECK_EQ(fb_replies_wait(t, b, 0), FB_REPLY_NO_RESPONDERS);
    /* a: past its deadline, it times out (and never leads); before it,
     * nobody leads, so its wait makes it the leader; then, leading, it
     * times out. */
    CHECK_EQ(fb_replies_wait(t, a, 0), FB_REPLY_TIMEOUT);
    CHECK_EQ(fb_replies_wait(t, a, fb_now_ns() + 1000000000ull), FB_REPLY_LEAD);
    CHECK_EQ(fb_replies_wait(t, a, fb_now_ns() + 1000000), FB_REPLY_TIMEOUT);
    fb_replies_unlead(t);
    fb_reply r;
    CHECK_EQ(fb_replies_close(t, c, &r), FB_REPLY_DONE);
    char want[32];
    int wl = snprintf(want, sizeof want, "r%llu", (unsigned long long)c);
    CHECK(r.buf && r.headers_len == 0 && r.len == (size_t)wl && !memcmp(r.buf, want, (size_t)wl));
    fb_free(r.buf);
    CHECK_EQ(fb_replies_close(t, b, &r), FB_REPLY_NO_RESPONDERS);
    CHECK(r.buf == NULL);
    CHECK_EQ(fb_replies_close(t, a, NULL), FB_REPLY_WAITING);
    CHECK_EQ(fb_replies_close(t, a, NULL), FB_ENOTFOUND);
    /* A reply after its request gave up: unmatched. */
    CHECK_EQ(fb_replies_take(t, batch, len), 0);
    fb_replies_stats st;
    fb_replies_get_stats(t, &st);
    CHECK_EQ(st.opened, 3);
    CHECK_EQ(st.replied, 1);
    CHECK_EQ(st.no_responders, 1);
    CHECK_EQ(st.unmatched, 4 + 6);
    /* A malformed batch matches nothing. */
    batch[0] = 'X';
    CHECK(fb_replies_take(t, batch, len) < 0);
    fb_free(batch);
    fb_replies_free(t);
}

/* More requests than the first table holds, some left waiting a long
 * time (the table grows around them); max_pending bounds them. */
static void test_grows_and_bounds(void)
{
    fb_replies *t = fb_replies_new(PREFIX, sizeof PREFIX - 1, 1000);
    uint64_t old, id;
    CHECK_EQ(fb_replies_open(t, 0, &old), FB_OK);
    uint64_t ids[999];
    for (int i = 0; i < 999; i++) CHECK_EQ(fb_replies_open(t, 0, &ids[i]), FB_OK);
    CHECK_EQ(fb_replies_open(t, 0, &id), FB_ELIMIT);
    for (int i = 0; i < 999; i++) CHECK_EQ(fb_replies_close(t, ids[i], NULL), FB_REPLY_WAITING);
    for (int i = 0; i < 5000; i++) {              /* ids wrap around the table past `old` */
        CHECK_EQ(fb_replies_open(t, 0, &id), FB_OK);
        CHECK_EQ(fb_replies_close(t, id, NULL), FB_REPLY_WAITING);
    }
    uint64_t one[] = { old };
    size_t len;
    unsigned char *b = replies_of(one, NULL, NULL, 1, &len);
    CHECK_EQ(fb_replies_take(t, b, len), 1);
    CHECK_EQ(fb_replies_state(t, old), FB_REPLY_DONE);
    fb_free(b);
    fb_replies_free(t);
}

/* Threads: one leads (reads, here: hands batches in), the others wait on
 * their own slots; when the leader's reply comes it stops leading and
 * another waiter is asked to lead. */
typedef struct waiter { fb_replies *t; uint64_t id; int leads, result; } waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;
    for (;;) {
        int rc = fb_replies_wait(w->t, w->id, fb_now_ns() + 5000000000ull);
        if (rc != FB_REPLY_LEAD) {
            w->result = rc;
            return NULL;
        }
        w->leads++;
        /* As a leader that finds nothing to read: look again shortly. */
        while (fb_replies_state(w->t, w->id) == FB_REPLY_WAITING) usleep(200);
        fb_replies_unlead(w->t);
    }
}

static void test_threads_and_the_lead(void)
{
    enum { N = 8 };
    fb_replies *t = fb_replies_new(PREFIX, sizeof PREFIX - 1, 64);
    waiter w[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        w[i] = (waiter){ t, 0, 0, -100 };
        REQUIRE(fb_replies_open(t, 0, &w[i].id) == FB_OK);
        REQUIRE(pthread_create(&th[i], NULL, wait_thread, &w[i]) == 0);
    }
    usleep(20000);
    for (int i = N - 1; i >= 0; i--) {            /* replies in the reverse order */
        size_t len;
        unsigned char *b = replies_of(&w[i].id, NULL, NULL, 1, &len);
        CHECK_EQ(fb_replies_take(t, b, len), 1);
        fb_free(b);
        usleep(2000);
    }
    int leads = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(w[i].result, FB_REPLY_DONE);
        leads += w[i].leads;
        CHECK_EQ(fb_replies_close(t, w[i].id, NULL), FB_REPLY_DONE);
    }
    CHECK(leads >= 1 && leads <= N);
    fb_replies_free(t);
}

static void test_async_done_list(void)
{
    int p[2];
    REQUIRE(pipe(p) == 0);
    fb_replies *t = fb_replies_new(PREFIX, sizeof PREFIX - 1, 64);
    fb_replies_set_wake_fd(t, p[1]);
    uint64_t a, b;
    fb_replies_open(t, 1, &a);
    fb_replies_open(t, 1, &b);
    uint64_t ids[] = { b, a };
    size_t len;
    unsigned char *batch = replies_of(ids, NULL, NULL, 2, &len);
    CHECK_EQ(fb_replies_take(t, batch, len), 2);
    unsigned char buf[64];
    CHECK_EQ(read(p[0], buf, sizeof buf), 8);          /* one wake for the two */
    uint64_t done[4];
    CHECK_EQ(fb_replies_done(t, done, 4), 2);
    CHECK(done[0] == b && done[1] == a);
    CHECK_EQ(fb_replies_done(t, done, 4), 0);
    fb_free(batch);
    fb_replies_close_all(t);
    uint64_t c;
    fb_replies_open(t, 0, &c);
    CHECK_EQ(fb_replies_wait(t, c, fb_now_ns() + 1000000000ull), FB_REPLY_CLOSED);
    fb_replies_free(t);
    close(p[0]);
    close(p[1]);
}

int main(void)
{
    RUN(test_matched_by_id);
    RUN(test_grows_and_bounds);
    RUN(test_threads_and_the_lead);
    RUN(test_async_done_list);
    CTEST_END();
}
