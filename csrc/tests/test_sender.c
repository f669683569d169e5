/* test_sender.c - the client's native sender (fb_sender.h) against a fake
 * socket, with the queue (fb_batchq.h), the lock (fb_slock.h) and
 * fb_outbox_untake it relies on. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "ctest.h"
#include "fb_batch.h"
#include "fb_batchq.h"
#include "fb_outbox.h"
#include "fb_sender.h"
#include "fb_slock.h"

/* -- a fake libzmq socket: records each message's frames; room is a switch */

typedef struct fake {
    int room;                 /* POLLOUT while set; a send without room fails (EAGAIN) */
    int sends, messages;      /* frames and whole messages taken */
    uint32_t records;         /* records in the batches taken, in order... */
    uint32_t next_id;         /* ...checked against this */
    int out_of_order;
} fake;

static fake F;

/* What the broker says: two-frame messages [cmd, body], read by a reader
 * (fb_reader.h) through the calls below; `pause_after` scripts a FLOW
 * pause that arrives once that many batches were sent. */
typedef struct said { const char *frames[2]; int next, frame; } said;
static said IN[8];
static int in_n, in_next, in_frame, pause_after = -1;
static int looks;             /* ZMQ_EVENTS asked: on a Stream, a read of the kernel each */
static int rig_level;         /* the next rig's socket is level-triggered (z.pending) */
static int in_fd[2];                            /* stands for ZMQ_FD */

static void say(const char *cmd, const char *body)
{
    IN[in_n].frames[0] = cmd;
    IN[in_n].frames[1] = body;
    __atomic_add_fetch(&in_n, 1, __ATOMIC_SEQ_CST);
    char c = 0;
    ssize_t w = write(in_fd[1], &c, 1);
    (void)w;
}

typedef struct fake_msg { const char *data; size_t size; int more; } fake_msg;
static int f_init(fb_zmq_msg *m) { memset(m, 0, sizeof *m); return 0; }
static int f_close(fb_zmq_msg *m) { (void)m; return 0; }
static void *f_data(fb_zmq_msg *m) { return (void *)((fake_msg *)m)->data; }
static size_t f_size(const fb_zmq_msg *m) { return ((const fake_msg *)m)->size; }
static int f_more(const fb_zmq_msg *m) { return ((const fake_msg *)m)->more; }

static int f_recv(fb_zmq_msg *m, void *sock, int flags)
{
    (void)sock;
    (void)flags;
    if (in_next >= __atomic_load_n(&in_n, __ATOMIC_SEQ_CST)) {
        errno = EAGAIN;
        return -1;
    }
    fake_msg *fm = (fake_msg *)m;
    fm->data = IN[in_next].frames[in_frame];
    fm->size = strlen(fm->data);
    fm->more = in_frame == 0;
    if (++in_frame == 2) {
        in_frame = 0;
        in_next++;
    }
    return (int)fm->size;
}

/* A lease ping taken (fb_sender.h view): its frames. */
static int pings, ping_frames, frame_no, in_ping;
static unsigned char ping_token[64];
static size_t ping_token_len;
static char ping_ask[16];

static int fake_send(void *sock, const void *buf, size_t len, int flags)
{
    (void)sock;
    if (!F.room) {
        errno = EAGAIN;
        return -1;
    }
    F.sends++;
    if (frame_no == 0) in_ping = len == 1 && *(const char *)buf == 'p';
    if (in_ping) {
        ping_frames++;
        if (frame_no == 1 && len <= sizeof ping_token) {
            memcpy(ping_token, buf, len);
            ping_token_len = len;
        }
        if (frame_no == 2 && len < sizeof ping_ask) memcpy(ping_ask, buf, len);
        frame_no = (flags & 2) ? frame_no + 1 : 0;
        if (!(flags & 2)) __atomic_add_fetch(&pings, 1, __ATOMIC_SEQ_CST);
        return (int)len;
    }
    frame_no = (flags & 2) ? frame_no + 1 : 0;
    if (flags & 2) return (int)len;             /* the command frame */
    if (++F.messages == pause_after) say("F", "p");
    static fb_record recs[1024];
    size_t n = 0;
    REQUIRE(fb_batch_decode(buf, len, NULL, recs, 1024, &n) == FB_OK);
    for (size_t i = 0; i < n; i++) {
        uint32_t id;
        REQUIRE(recs[i].payload_len == sizeof id);
        memcpy(&id, recs[i].payload, sizeof id);
        if (id != F.next_id) F.out_of_order++;
        F.next_id = id + 1;
        __atomic_add_fetch(&F.records, 1, __ATOMIC_SEQ_CST);
    }
    return (int)len;
}

static int fake_getsockopt(void *sock, int option, void *value, size_t *len)
{
    (void)sock;
    (void)len;
    REQUIRE(option == 15);                      /* ZMQ_EVENTS */
    __atomic_add_fetch(&looks, 1, __ATOMIC_SEQ_CST);
    char b[16];
    while (read(in_fd[0], b, sizeof b) > 0) {  /* commands processed: the edge is consumed */
    }
    *(int *)value = (F.room ? 2 : 0) | (in_next < __atomic_load_n(&in_n, __ATOMIC_SEQ_CST) ? 1 : 0);
    return 0;
}

static int fake_nothing_buffered(void *sock)
{
    (void)sock;
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int wait_until(volatile uint32_t *v, uint32_t want, int ms)
{
    for (int i = 0; i < ms && __atomic_load_n(v, __ATOMIC_SEQ_CST) < want; i++) sleep_ms(1);
    return __atomic_load_n(v, __ATOMIC_SEQ_CST) >= want;
}

typedef struct rig {
    fb_outbox o;
    fb_lock ol;
    fb_slock sl;
    fb_batchq q;
    fb_burst burst;
    int owner[2];
    fb_sender s;
} rig;

static void rig_start(rig *r, size_t max_messages)
{
    memset(r, 0, sizeof *r);
    memset(&F, 0, sizeof F);
    in_n = in_next = in_frame = looks = 0;
    pause_after = -1;
    pings = ping_frames = frame_no = in_ping = 0;
    ping_token_len = 0;
    memset(ping_ask, 0, sizeof ping_ask);
    REQUIRE(pipe(in_fd) == 0);
    fcntl(in_fd[0], F_SETFL, O_NONBLOCK);
    fcntl(in_fd[1], F_SETFL, O_NONBLOCK);
    F.room = 1;
    fb_outbox_limits lim = {max_messages, 0, 0, 0};
    fb_outbox_init(&r->o, &lim);
    REQUIRE(fb_slock_init(&r->sl) == 0);
    fb_batchq_init(&r->q);
    REQUIRE(pipe(r->owner) == 0);
    fcntl(r->owner[0], F_SETFL, O_NONBLOCK);
    fcntl(r->owner[1], F_SETFL, O_NONBLOCK);
    r->s.z.send = fake_send;
    r->s.z.getsockopt = fake_getsockopt;
    r->s.z.pending = rig_level ? fake_nothing_buffered : NULL;
    rig_level = 0;
    r->s.sock = &F;
    r->s.slock = &r->sl;
    r->s.outbox = &r->o;
    r->s.outbox_lock = &r->ol;
    r->s.sealed = &r->q;
    fb_burst_init(&r->burst, 1000000, 4);
    r->s.burst = &r->burst;
    r->s.command = "P";
    r->s.command_len = 1;
    r->s.owner_fd = r->owner[1];
    REQUIRE(fb_sender_start(&r->s) == 0);
}

static void rig_stop(rig *r)
{
    fb_sender_stop(&r->s);
    fb_sender_stop(&r->s);                      /* twice: harmless */
    fb_outbox_destroy(&r->o);
    fb_batchq_clear(&r->q);
    fb_slock_destroy(&r->sl);
    close(r->owner[0]);
    close(r->owner[1]);
    close(in_fd[0]);
    close(in_fd[1]);
}

static void append(rig *r, uint32_t id)
{
    fb_lock_wait(&r->ol);
    REQUIRE(fb_outbox_append(&r->o, "t", 1, &id, sizeof id, fb_now_ns()) >= 0);
    fb_lock_release(&r->ol);
}

/* Records from..to-1 as one sealed batch (as a publisher seals a full one). */
static void seal(rig *r, uint32_t from, uint32_t to)
{
    fb_lock_wait(&r->ol);
    for (uint32_t i = from; i < to; i++) REQUIRE(fb_outbox_append(&r->o, "t", 1, &i, sizeof i, 1) >= 0);
    unsigned char *buf;
    size_t len;
    REQUIRE(fb_outbox_take(&r->o, &buf, &len) == FB_OK);
    REQUIRE(fb_batchq_push(&r->q, buf, len, to - from) == FB_OK);
    fb_lock_release(&r->ol);
}

static int owner_woken(rig *r)
{
    char b[16];
    return read(r->owner[0], b, sizeof b) > 0;
}

static void test_sends_what_is_there_in_order(void)
{
    rig r;
    rig_start(&r, 100);
    for (uint32_t i = 0; i < 1000; i++) {
        append(&r, i);
        if (i % 37 == 0) fb_sender_wake(&r.s);
    }
    fb_sender_wake(&r.s);
    CHECK(wait_until(&F.records, 1000, 5000));
    /* The thread counts a batch after its send returns, and the fake socket
     * counts records during it: stop the thread before reading its counters
     * (under load, read at once, they once said 0 of 1000). */
    fb_sender_stop(&r.s);
    CHECK_EQ(F.out_of_order, 0);
    CHECK_EQ(__atomic_load_n(&r.s.sent_messages, __ATOMIC_SEQ_CST), 1000);
    CHECK_EQ(r.burst.streak, 4);                      /* told the publisher it is busy */
    CHECK(r.burst.last_send_ns != 0);
    rig_stop(&r);
}

static void test_sealed_batches_go_first(void)
{
    rig r;
    rig_start(&r, 0);
    fb_lock_wait(&r.ol);
    for (uint32_t b = 0; b < 3; b++) {          /* three sealed batches of 10, then the outbox's */
        for (uint32_t i = 0; i < 10; i++) {
            uint32_t id = b * 10 + i;
            REQUIRE(fb_outbox_append(&r.o, "t", 1, &id, sizeof id, 1) >= 0);
        }
        unsigned char *buf;
        size_t len;
        REQUIRE(fb_outbox_take(&r.o, &buf, &len) == FB_OK);
        REQUIRE(fb_batchq_push(&r.q, buf, len, 10) == FB_OK);
    }
    CHECK_EQ(r.q.batches, 3);
    CHECK_EQ(r.q.count, 30);
    fb_lock_release(&r.ol);
    for (uint32_t i = 30; i < 35; i++) append(&r, i);
    fb_sender_wake(&r.s);
    CHECK(wait_until(&F.records, 35, 5000));
    CHECK_EQ(F.out_of_order, 0);
    CHECK_EQ(F.messages, 4);
    CHECK_EQ(r.q.batches, 0);
    CHECK_EQ(r.q.bytes, 0);
    rig_stop(&r);
}

static void test_no_room_hands_back_and_keeps_the_batch(void)
{
    rig r;
    rig_start(&r, 0);
    F.room = 0;
    for (uint32_t i = 0; i < 10; i++) append(&r, i);
    fb_sender_wake(&r.s);
    int woken = 0;
    for (int i = 0; i < 5000 && !woken; i++) {
        woken = owner_woken(&r);
        if (!woken) sleep_ms(1);
    }
    CHECK(woken);
    CHECK_EQ(__atomic_exchange_n(&r.s.handed, 0, __ATOMIC_SEQ_CST), 1);
    CHECK_EQ(fb_outbox_count(&r.o), 10);        /* nothing lost */
    F.room = 1;
    fb_sender_wake(&r.s);
    CHECK(wait_until(&F.records, 10, 5000));
    CHECK_EQ(F.out_of_order, 0);
    rig_stop(&r);
}

static void test_paused_and_owner_first_send_nothing(void)
{
    rig r;
    rig_start(&r, 0);
    __atomic_store_n(&r.s.paused, 1, __ATOMIC_SEQ_CST);
    append(&r, 0);
    fb_sender_wake(&r.s);
    sleep_ms(50);
    CHECK_EQ(F.sends, 0);
    __atomic_store_n(&r.s.paused, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&r.s.owner_first, 1, __ATOMIC_SEQ_CST);
    fb_sender_wake(&r.s);
    sleep_ms(50);
    CHECK_EQ(F.sends, 0);
    CHECK(owner_woken(&r));                     /* control frames first: the owner's */
    __atomic_store_n(&r.s.owner_first, 0, __ATOMIC_SEQ_CST);
    fb_sender_wake(&r.s);
    CHECK(wait_until(&F.records, 1, 5000));
    rig_stop(&r);
}

static void test_waits_for_the_connection_and_wakes_a_skipped_owner(void)
{
    rig r;
    rig_start(&r, 0);
    REQUIRE(fb_slock_try(&r.sl));               /* the owner holds the connection */
    append(&r, 0);
    fb_sender_wake(&r.s);
    sleep_ms(50);
    CHECK_EQ(F.sends, 0);
    __atomic_store_n(&r.s.owner_skipped, 1, __ATOMIC_SEQ_CST);
    CHECK_EQ(fb_slock_release(&r.sl), 0);
    CHECK(wait_until(&F.records, 1, 5000));
    int woken = 0;
    for (int i = 0; i < 5000 && !woken; i++) {
        woken = owner_woken(&r);
        if (!woken) sleep_ms(1);
    }
    CHECK(woken);
    CHECK_EQ(r.s.owner_skipped, 0);
    rig_stop(&r);
}

static void test_linger_holds_a_partial_batch(void)
{
    rig r;
    rig_start(&r, 0);
    REQUIRE(fb_slock_try(&r.sl));               /* the thread reads these only holding it */
    r.s.linger_ns = 200000000;                  /* 200 ms after the last send */
    r.burst.last_send_ns = fb_now_ns();
    CHECK_EQ(fb_slock_release(&r.sl), 0);
    append(&r, 0);
    fb_sender_wake(&r.s);
    sleep_ms(50);
    CHECK_EQ(F.records, 0);
    CHECK(wait_until(&F.records, 1, 5000));     /* then it leaves by itself */
    rig_stop(&r);
}

/* fb_sender_send_now: the publishing thread sends in C, at once (a
 * lingering batch too), and marks the publisher busy only for a full
 * batch; what it cannot do goes to the thread or the owner. */
/* On a level-triggered socket (a Stream) a send is looked at once before
 * each batch (what the broker said: a FLOW pause), never for nothing after
 * the last (its descriptor still says what came): one read of the kernel
 * a batch, on the path of every message published one at a time. */
static void test_a_level_triggered_socket_is_looked_at_once_a_batch(void)
{
    rig r;
    rig_level = 1;
    rig_start(&r, 0);
    append(&r, 0);
    int before = __atomic_load_n(&looks, __ATOMIC_SEQ_CST);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 1);
    CHECK_EQ(F.records, 1);
    CHECK_EQ(__atomic_load_n(&looks, __ATOMIC_SEQ_CST) - before, 1);
    /* A sealed batch and the outbox's: two batches, two looks. */
    seal(&r, 1, 3);
    append(&r, 3);
    before = __atomic_load_n(&looks, __ATOMIC_SEQ_CST);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 2);
    CHECK_EQ(F.records, 4);
    CHECK_EQ(F.out_of_order, 0);
    CHECK_EQ(__atomic_load_n(&looks, __ATOMIC_SEQ_CST) - before, 2);
    rig_stop(&r);
}

static void test_the_publishing_thread_sends_now(void)
{
    rig r;
    rig_start(&r, 0);
    REQUIRE(fb_slock_try(&r.sl));               /* the thread reads these only holding it */
    r.s.linger_ns = 10000000000ULL;             /* the thread would hold a partial batch 10 s */
    r.burst.last_send_ns = fb_now_ns();
    CHECK_EQ(fb_slock_release(&r.sl), 0);
    for (uint32_t i = 0; i < 3; i++) append(&r, i);
    uint64_t before = r.burst.last_send_ns;
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 1);
    CHECK_EQ(F.records, 3);                     /* sent before the call returned */
    CHECK_EQ(r.s.inline_messages, 3);
    CHECK_EQ(r.s.inline_batches, 1);
    CHECK_EQ(r.s.sent_messages, 0);             /* (the thread's count) */
    CHECK_EQ(r.burst.streak, 1);                      /* idle still: one more towards the burst limit */
    CHECK(r.burst.last_send_ns >= before);
    CHECK(!fb_slock_held(&r.sl));
    append(&r, 3);
    CHECK_EQ(fb_sender_send_now(&r.s, 1), 1);   /* a full batch: the publisher is busy */
    CHECK_EQ(r.burst.streak, 4);

    /* Sealed batches first, in one call. */
    seal(&r, 4, 6);
    append(&r, 6);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 2);
    CHECK_EQ(F.records, 7);
    CHECK_EQ(F.out_of_order, 0);

    /* Paused: nothing (the resume wakes the thread). */
    __atomic_store_n(&r.s.paused, 1, __ATOMIC_SEQ_CST);
    append(&r, 7);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 0);
    CHECK_EQ(F.records, 7);
    __atomic_store_n(&r.s.paused, 0, __ATOMIC_SEQ_CST);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 1);

    /* Control frames first: the owner's, woken. */
    while (owner_woken(&r)) {
    }
    __atomic_store_n(&r.s.owner_first, 1, __ATOMIC_SEQ_CST);
    append(&r, 8);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 0);
    CHECK(owner_woken(&r));
    CHECK_EQ(fb_outbox_count(&r.o), 1);
    __atomic_store_n(&r.s.owner_first, 0, __ATOMIC_SEQ_CST);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 1);

    /* No room (no reader): kept, and the owner told. */
    F.room = 0;
    append(&r, 9);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 0);
    CHECK(owner_woken(&r));
    CHECK_EQ(fb_outbox_count(&r.o), 1);
    F.room = 1;
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 1);

    /* An owner that found the connection taken is woken when it is let go. */
    __atomic_store_n(&r.s.owner_skipped, 1, __ATOMIC_SEQ_CST);
    append(&r, 10);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 1);
    CHECK_EQ(r.s.owner_skipped, 0);
    CHECK(owner_woken(&r));

    /* The outbox taken (another publishing thread appends, and may wait
     * for the interpreter lock our caller holds): no wait; the thread,
     * woken, sends it. */
    append(&r, 11);
    REQUIRE(fb_slock_try(&r.sl));
    r.s.linger_ns = 0;
    CHECK_EQ(fb_slock_release(&r.sl), 0);
    REQUIRE(fb_lock_try(&r.ol));
    CHECK_EQ(fb_sender_send_now(&r.s, 0), 0);
    CHECK_EQ(F.records, 11);
    fb_lock_release(&r.ol);
    CHECK(wait_until(&F.records, 12, 5000));

    /* The connection taken: the thread is woken, and sends once it has it. */
    REQUIRE(fb_slock_try(&r.sl));
    append(&r, 12);
    CHECK_EQ(fb_sender_send_now(&r.s, 0), -1);
    CHECK_EQ(F.records, 12);
    CHECK_EQ(fb_slock_release(&r.sl), 0);
    CHECK(wait_until(&F.records, 13, 5000));
    fb_sender_stop(&r.s);
    CHECK_EQ(F.out_of_order, 0);
    CHECK_EQ(r.s.inline_messages + r.s.sent_messages, 13);
    rig_stop(&r);
}

/* With the connection's reader: what the broker says is read between
 * batches, so a FLOW pause stops the sender after the batch in flight, and
 * the resume (read by the reader's own thread) starts it again. */
static void test_reads_between_batches_and_stops_at_a_pause(void)
{
    rig r;
    rig_start(&r, 0);
    int owner[2];
    REQUIRE(pipe(owner) == 0);
    fcntl(owner[0], F_SETFL, O_NONBLOCK);
    fb_reader rd;
    memset(&rd, 0, sizeof rd);
    rd.z = (fb_zmq_recv_calls){f_init, f_recv, f_data, f_size, f_more, f_close, fake_getsockopt, fake_send, NULL};
    rd.sock = &F;
    rd.sock_fd = in_fd[0];
    rd.slock = &r.sl;
    rd.max_bytes = 1 << 20;
    rd.data_command = "D";
    rd.data_command_len = 1;
    rd.owner_fd = owner[1];
    fb_react x;                                 /* its reactions: FLOW only */
    memset(&x, 0, sizeof x);
    x.send = fake_send;
    x.sock = &F;
    x.flow_command = "F";
    x.flow_command_len = 1;
    x.flow_pause = 'p';
    x.flow_paused = &r.s.paused;
    x.flow_wake = &r.s.wake;
    rd.react = &x;
    REQUIRE(fb_slock_try(&r.sl));               /* the thread sends nothing before this is set */
    REQUIRE(fb_reader_start(&rd) == 0);
    __atomic_store_n(&r.s.reader, &rd, __ATOMIC_SEQ_CST);
    pause_after = 3;                            /* a pause arrives with the third batch */
    fb_lock_wait(&r.ol);
    for (uint32_t i = 0; i < 50; i++) {         /* fifty sealed batches of one record */
        REQUIRE(fb_outbox_append(&r.o, "t", 1, &i, sizeof i, 1) >= 0);
        unsigned char *buf;
        size_t len;
        REQUIRE(fb_outbox_take(&r.o, &buf, &len) == FB_OK);
        REQUIRE(fb_batchq_push(&r.q, buf, len, 1) == FB_OK);
    }
    fb_lock_release(&r.ol);
    CHECK_EQ(fb_slock_release(&r.sl), 0);
    fb_sender_wake(&r.s);
    CHECK(wait_until(&F.records, 3, 5000));
    sleep_ms(50);
    CHECK_EQ(F.messages, 3);                    /* not one batch after the pause */
    CHECK_EQ(__atomic_load_n(&r.s.paused, __ATOMIC_SEQ_CST), 1);
    CHECK_EQ(__atomic_load_n(&x.flow_pauses, __ATOMIC_SEQ_CST), 1);    /* counted by the reader... */
    CHECK_EQ(__atomic_load_n(&rd.handed, __ATOMIC_SEQ_CST), 0);   /* ...which wakes no owner for it */
    CHECK_EQ(__atomic_load_n(&r.s.handed, __ATOMIC_SEQ_CST), 0);  /* and the owner has nothing to send */
    say("F", "r");                              /* the resume: the reader's thread reads it */
    CHECK(wait_until(&F.records, 50, 5000));
    CHECK_EQ(F.out_of_order, 0);
    CHECK_EQ(__atomic_load_n(&r.s.paused, __ATOMIC_SEQ_CST), 0);
    REQUIRE(fb_slock_wait(&r.sl, -1));
    __atomic_store_n(&r.s.reader, NULL, __ATOMIC_SEQ_CST);
    CHECK_EQ(fb_slock_release(&r.sl), 0);
    fb_reader_stop(&rd);
    rig_stop(&r);
    close(owner[0]);
    close(owner[1]);
}

static void test_sends_the_lease_ping_the_publisher_asks_for_even_paused(void)
{
    rig r;
    fb_view v;
    fb_view_init(&v);
    fb_view_forget(&v);
    fb_view_lease(&v, fb_now_ns(), 100000);
    /* Set before the thread starts, as the binding does. */
    memset(&r, 0, sizeof r);
    rig_start(&r, 0);
    fb_sender_stop(&r.s);
    fb_react x;                                 /* the connection's reactions: their view's lease */
    memset(&x, 0, sizeof x);
    x.send = fake_send;
    x.sock = &F;
    x.view = &v;
    x.ping_command = "p";
    x.ping_command_len = 1;
    x.lease_token = "lease:";
    x.lease_token_len = 6;
    x.lease_ask = "lease";
    x.lease_ask_len = 5;
    r.s.react = &x;
    REQUIRE(fb_sender_start(&r.s) == 0);
    __atomic_store_n(&r.s.paused, 1, __ATOMIC_SEQ_CST);       /* a pause stops data, not this */
    fb_sender_wake(&r.s);
    sleep_ms(20);
    CHECK_EQ(__atomic_load_n(&pings, __ATOMIC_SEQ_CST), 0);    /* nobody asked */
    uint64_t before = fb_now_ns();
    CHECK_EQ(fb_view_ask_renewal(&v, before, 1), 1);
    fb_sender_wake(&r.s);
    CHECK(wait_until((volatile uint32_t *)&pings, 1, 5000));
    CHECK_EQ(ping_frames, 3);
    CHECK_EQ(ping_token_len, 14);
    CHECK(memcmp(ping_token, "lease:", 6) == 0);
    uint64_t sent = 0;
    for (int i = 7; i >= 0; i--) sent = sent << 8 | ping_token[6 + i];
    CHECK(sent >= before && sent <= fb_now_ns());            /* its send time, which the lease counts from */
    CHECK(strcmp(ping_ask, "lease") == 0);
    CHECK_EQ(v.renew, FB_VIEW_RENEW_SENT);
    CHECK_EQ(x.lease_pings, 1);
    CHECK_EQ(F.messages, 0);
    /* No room: it tries again until the socket takes it. */
    fb_view_lease(&v, sent, 100000);                          /* (the answer) */
    F.room = 0;
    CHECK_EQ(fb_view_ask_renewal(&v, fb_now_ns(), 1), 1);
    fb_sender_wake(&r.s);
    sleep_ms(20);
    CHECK_EQ(__atomic_load_n(&pings, __ATOMIC_SEQ_CST), 1);
    CHECK_EQ(__atomic_load_n(&v.renew, __ATOMIC_SEQ_CST), FB_VIEW_RENEW_WANTED);
    F.room = 1;
    CHECK(wait_until((volatile uint32_t *)&pings, 2, 5000));
    /* Control frames the owner holds go first: no ping overtakes them;
     * the owner wakes the thread once they are sent. */
    fb_view_lease(&v, fb_now_ns(), 100000);
    __atomic_store_n(&r.s.owner_first, 1, __ATOMIC_SEQ_CST);
    CHECK_EQ(fb_view_ask_renewal(&v, fb_now_ns(), 1), 1);
    fb_sender_wake(&r.s);
    sleep_ms(20);
    CHECK_EQ(__atomic_load_n(&pings, __ATOMIC_SEQ_CST), 2);
    __atomic_store_n(&r.s.owner_first, 0, __ATOMIC_SEQ_CST);
    fb_sender_wake(&r.s);
    CHECK(wait_until((volatile uint32_t *)&pings, 3, 5000));
    rig_stop(&r);
    fb_view_free(&v);
}

static void test_slock(void)
{
    fb_slock l;
    REQUIRE(fb_slock_init(&l) == 0);
    CHECK(fb_slock_try(&l));
    CHECK(!fb_slock_try(&l));
    CHECK(!fb_slock_wait(&l, 1000000));         /* 1 ms: times out */
    CHECK_EQ(fb_slock_release(&l), 0);
    CHECK_EQ(fb_slock_release(&l), -1);         /* not held */
    CHECK(fb_slock_wait(&l, -1));
    CHECK(fb_slock_held(&l));
    CHECK_EQ(fb_slock_release(&l), 0);
    fb_slock_destroy(&l);
}

static void test_batchq_and_untake(void)
{
    fb_batchq q;
    fb_batchq_init(&q);
    unsigned char *a = malloc(3), *b = malloc(5), *buf;
    size_t len;
    uint32_t count;
    CHECK_EQ(fb_batchq_pop(&q, &buf, &len, &count), 0);
    REQUIRE(fb_batchq_push(&q, a, 3, 1) == FB_OK);
    REQUIRE(fb_batchq_push_front(&q, b, 5, 2) == FB_OK);
    CHECK_EQ(q.batches, 2);
    CHECK_EQ(q.bytes, 8);
    CHECK_EQ(q.count, 3);
    CHECK_EQ(fb_batchq_peek(&q, &buf, &len, &count), 1);
    CHECK(buf == b && len == 5 && count == 2);
    CHECK_EQ(fb_batchq_pop(&q, &buf, &len, &count), 1);
    CHECK(buf == b);
    free(buf);
    fb_batchq_clear(&q);                        /* frees a */
    CHECK_EQ(q.batches, 0);

    fb_outbox_limits lim = {0, 0, 0, 1};        /* with the checksum trailer */
    fb_outbox o;
    fb_outbox_init(&o, &lim);
    REQUIRE(fb_outbox_append(&o, "t", 1, "x", 1, 7) >= 0);
    size_t before = fb_outbox_bytes(&o);
    REQUIRE(fb_outbox_take(&o, &buf, &len) == FB_OK);
    CHECK_EQ(fb_outbox_untake(&o, buf, len, 1), FB_OK);
    CHECK_EQ(fb_outbox_count(&o), 1);
    CHECK_EQ(fb_outbox_bytes(&o), before);
    CHECK_EQ(fb_outbox_untake(&o, buf, len, 1), FB_EINVAL);   /* not empty */
    REQUIRE(fb_outbox_take(&o, &buf, &len) == FB_OK);
    size_t n = 0;
    fb_record rec;
    CHECK_EQ(fb_batch_decode(buf, len, NULL, &rec, 1, &n), FB_OK);   /* still a valid batch, checksum too */
    CHECK_EQ(n, 1);
    free(buf);
    fb_outbox_destroy(&o);
}

int main(void)
{
    RUN(test_sends_the_lease_ping_the_publisher_asks_for_even_paused);
    RUN(test_a_level_triggered_socket_is_looked_at_once_a_batch);
    RUN(test_slock);
    RUN(test_batchq_and_untake);
    RUN(test_sends_what_is_there_in_order);
    RUN(test_sealed_batches_go_first);
    RUN(test_no_room_hands_back_and_keeps_the_batch);
    RUN(test_paused_and_owner_first_send_nothing);
    RUN(test_waits_for_the_connection_and_wakes_a_skipped_owner);
    RUN(test_linger_holds_a_partial_batch);
    RUN(test_the_publishing_thread_sends_now);
    RUN(test_reads_between_batches_and_stops_at_a_pause);
    CTEST_END();
}
