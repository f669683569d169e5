/* test_reader.c - the client's native reader (fb_reader.h) against a fake
 * socket: whole messages queued in order, up to its bound, the owner told
 * of what is not data, the lock respected. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "ctest.h"
#include "fb_outbox.h"
#include "fb_reader.h"

/* -- a fake libzmq socket: a script of messages (frames), readable through
 * a pipe that stands for ZMQ_FD */

#define MAXMSG 4096
typedef struct fmsg { int nframes; const char *frames[4]; size_t lens[4]; } fmsg;
typedef struct fake {
    fmsg msgs[MAXMSG];
    int n, next, frame;       /* messages scripted; next to read; its next frame */
    int fd[2];
    unsigned char sent[256];  /* what was sent, each frame as a length byte and the bytes */
    size_t sent_len;
    int send_fails;           /* send() says EAGAIN */
    /* Level-triggered (a Stream's descriptor): readable while a message
     * waits (the pipe is emptied with the last one read, under `mu`, as
     * the script fills it), z.pending says nothing is buffered, and
     * ZMQ_EVENTS reads the kernel, as a Stream's does. */
    int level;
    pthread_mutex_t mu;
    int recvs, empty_reads;   /* frames read; reads of the kernel that found nothing */
} fake;
static fake F;

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
    if (F.level) pthread_mutex_lock(&F.mu);
    int next = __atomic_load_n(&F.next, __ATOMIC_SEQ_CST);
    if (next >= __atomic_load_n(&F.n, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&F.empty_reads, 1, __ATOMIC_SEQ_CST);
        if (F.level) pthread_mutex_unlock(&F.mu);
        return -1;
    }
    fmsg *msg = &F.msgs[next];
    fake_msg *fm = (fake_msg *)m;
    fm->data = msg->frames[F.frame];
    fm->size = msg->lens[F.frame];
    fm->more = F.frame + 1 < msg->nframes;
    __atomic_add_fetch(&F.recvs, 1, __ATOMIC_SEQ_CST);
    if (fm->more) F.frame++;
    else {
        F.frame = 0;
        __atomic_store_n(&F.next, next + 1, __ATOMIC_SEQ_CST);
        char b[64];
        if (F.level && next + 1 == F.n)
            while (read(F.fd[0], b, sizeof b) > 0) {    /* nothing waits: no longer readable */
            }
    }
    if (F.level) pthread_mutex_unlock(&F.mu);
    return (int)fm->size;
}

static int f_getsockopt(void *sock, int option, void *value, size_t *len)
{
    (void)sock;
    (void)len;
    REQUIRE(option == 15);
    if (F.level && __atomic_load_n(&F.next, __ATOMIC_SEQ_CST) >= __atomic_load_n(&F.n, __ATOMIC_SEQ_CST))
        __atomic_add_fetch(&F.empty_reads, 1, __ATOMIC_SEQ_CST);
    char b[64];
    while (!F.level && read(F.fd[0], b, sizeof b) > 0) {   /* commands processed: the edge is consumed */
    }
    *(int *)value = __atomic_load_n(&F.next, __ATOMIC_SEQ_CST) < __atomic_load_n(&F.n, __ATOMIC_SEQ_CST);
    return 0;
}

static int f_send(void *sock, const void *buf, size_t len, int flags)
{
    (void)sock;
    (void)flags;
    if (F.send_fails) return -1;
    REQUIRE(len < 64 && F.sent_len + 1 + len <= sizeof F.sent);
    F.sent[F.sent_len++] = (unsigned char)len;
    memcpy(F.sent + F.sent_len, buf, len);
    F.sent_len += len;
    return (int)len;
}

/* A message of n frames (lens: of binary frames). */
static void script_frames(int n, const char **frames, const size_t *lens)
{
    fmsg *m = &F.msgs[F.n];
    m->nframes = n;
    for (int i = 0; i < n; i++) {
        m->frames[i] = frames[i];
        m->lens[i] = lens[i];
    }
    __atomic_add_fetch(&F.n, 1, __ATOMIC_SEQ_CST);
    char c = 0;
    ssize_t w = write(F.fd[1], &c, 1);
    (void)w;
}

static int f_nothing_buffered(void *sock)
{
    (void)sock;
    return 0;
}

static void script(const char *cmd, const char *body)
{
    if (F.level) pthread_mutex_lock(&F.mu);
    fmsg *m = &F.msgs[F.n];
    m->nframes = 2;
    m->frames[0] = cmd;
    m->lens[0] = strlen(cmd);
    m->frames[1] = body;
    m->lens[1] = strlen(body);
    __atomic_add_fetch(&F.n, 1, __ATOMIC_SEQ_CST);
    char c = 0;
    ssize_t w = write(F.fd[1], &c, 1);              /* the socket's descriptor says "look" */
    (void)w;
    if (F.level) pthread_mutex_unlock(&F.mu);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct rig { fb_slock sl; int owner[2]; fb_reader r; fb_react x; } rig;

static int *rig_flow_paused;        /* set before rig_start: the flow hook under test */
static fb_wake *rig_flow_wake;
static fb_view *rig_view;           /* and the WANT hook */
static int rig_ping;                /* and liveness pings, every 20 ms */
static fb_replies *rig_replies;     /* and a client's inbox */
static int rig_level;               /* and a level-triggered socket (F.level) */

static void rig_start(rig *g, size_t max_bytes)
{
    memset(g, 0, sizeof *g);
    memset(&F, 0, sizeof F);
    if (rig_level) {
        F.level = 1;
        REQUIRE(pthread_mutex_init(&F.mu, NULL) == 0);
    }
    REQUIRE(pipe(F.fd) == 0);
    fcntl(F.fd[0], F_SETFL, O_NONBLOCK);
    fcntl(F.fd[1], F_SETFL, O_NONBLOCK);
    REQUIRE(pipe(g->owner) == 0);
    fcntl(g->owner[0], F_SETFL, O_NONBLOCK);
    REQUIRE(fb_slock_init(&g->sl) == 0);
    g->r.z = (fb_zmq_recv_calls){f_init, f_recv, f_data, f_size, f_more, f_close, f_getsockopt, f_send,
                                 rig_level ? f_nothing_buffered : NULL};
    rig_level = 0;
    g->r.sock = &F;
    g->r.sock_fd = F.fd[0];
    g->r.slock = &g->sl;
    g->r.max_bytes = max_bytes;
    g->r.data_command = "D";
    g->x.send = f_send;
    g->x.sock = &F;
    if (rig_flow_paused) {
        g->x.flow_command = "F";
        g->x.flow_command_len = 1;
        g->x.flow_pause = 'p';
        g->x.flow_paused = rig_flow_paused;
        g->x.flow_wake = rig_flow_wake;
        g->x.flow_reset_command = "h";
        g->x.flow_reset_command_len = 1;
        rig_flow_paused = NULL;
        rig_flow_wake = NULL;
    }
    if (rig_view) {
        g->x.want_command = "W";
        g->x.want_command_len = 1;
        g->x.ack_command = "A";
        g->x.ack_command_len = 1;
        g->x.view = rig_view;
        g->x.pong_command = "q";
        g->x.pong_command_len = 1;
        g->x.lease_token = "lease:";
        g->x.lease_token_len = 6;
        rig_view = NULL;
    }
    if (rig_ping) {
        g->x.ping_command = "p";
        g->x.ping_command_len = 1;
        g->x.live_pong_command = "q";
        g->x.live_pong_command_len = 1;
        g->x.ping_interval_ns = 20000000;
        g->x.next_ping_ns = fb_now_ns() + g->x.ping_interval_ns;
        rig_ping = 0;
    }
    g->r.react = &g->x;
    g->r.replies = rig_replies;
    rig_replies = NULL;
    g->r.data_command_len = 1;
    g->r.owner_fd = g->owner[1];
    REQUIRE(fb_reader_start(&g->r) == 0);
}

static void rig_stop(rig *g)
{
    fb_reader_stop(&g->r);
    fb_reader_stop(&g->r);
    fb_slock_destroy(&g->sl);
    close(g->owner[0]);
    close(g->owner[1]);
    close(F.fd[0]);
    close(F.fd[1]);
    if (F.level) pthread_mutex_destroy(&F.mu);
}

static int queued(rig *g)
{
    REQUIRE(fb_slock_wait(&g->sl, -1));
    int n = (int)g->r.queued;
    fb_slock_release(&g->sl);
    return n;
}

static int wait_queued(rig *g, int n)
{
    for (int i = 0; i < 5000; i++) {
        if (queued(g) >= n) return 1;
        sleep_ms(1);
    }
    return 0;
}

/* Wait until the thread has read n messages (queued or taken). */
static int wait_read(rig *g, uint64_t n)
{
    for (int i = 0; i < 5000; i++) {
        if (__atomic_load_n(&g->r.read_messages, __ATOMIC_SEQ_CST) >= n) return 1;
        sleep_ms(1);
    }
    return 0;
}

/* Pop one message under the lock: its body into out. */
static int pop(rig *g, char *cmd, char *out)
{
    fb_reader_item *it;
    const unsigned char *frames[4];
    size_t lens[4];
    REQUIRE(fb_slock_wait(&g->sl, -1));
    size_t n = fb_reader_pop(&g->r, &it, frames, lens, 4);
    if (n == 2) {
        memcpy(cmd, frames[0], lens[0]);
        cmd[lens[0]] = 0;
        memcpy(out, frames[1], lens[1]);
        out[lens[1]] = 0;
    }
    fb_reader_release(it);
    fb_slock_release(&g->sl);
    fb_reader_wake(&g->r);                          /* (as the owner does after it lets go) */
    return (int)n;
}

static int owner_woken(rig *g)
{
    char b[16];
    for (int i = 0; i < 2000; i++) {
        if (read(g->owner[0], b, sizeof b) > 0) return 1;
        sleep_ms(1);
    }
    return 0;
}

static void test_queues_messages_in_order(void)
{
    rig g;
    rig_start(&g, 1 << 20);
    static char bodies[100][12];
    for (int i = 0; i < 100; i++) {
        snprintf(bodies[i], sizeof bodies[i], "%d", i);
        script("D", bodies[i]);
    }
    CHECK(wait_queued(&g, 100));
    CHECK_EQ(__atomic_load_n(&g.r.read_messages, __ATOMIC_SEQ_CST), 100);
    CHECK_EQ(g.r.handed, 0);                        /* data only: the owner is not woken */
    char cmd[8], body[12];
    for (int i = 0; i < 100; i++) {
        CHECK_EQ(pop(&g, cmd, body), 2);
        CHECK(strcmp(cmd, "D") == 0 && atoi(body) == i);
    }
    CHECK_EQ(pop(&g, cmd, body), 0);
    rig_stop(&g);
}

/* On a level-triggered socket (a Stream) the reader stops after a read
 * that left nothing buffered, and its descriptor brings it back: every
 * message read, in order, and no read that finds nothing (a system call
 * each, on the path of every reply a requester waits for). */
static void test_a_level_triggered_socket_is_read_without_empty_reads(void)
{
    rig g;
    rig_level = 1;
    rig_start(&g, 1 << 20);
    static char bodies[200][12];
    for (int i = 0; i < 100; i++) {
        snprintf(bodies[i], sizeof bodies[i], "%d", i);
        script("D", bodies[i]);
    }
    CHECK(wait_queued(&g, 100));
    for (int i = 100; i < 200; i++) {               /* and while it reads */
        snprintf(bodies[i], sizeof bodies[i], "%d", i);
        script("D", bodies[i]);
        if (i % 10 == 0) sleep_ms(1);
    }
    CHECK(wait_queued(&g, 200));
    sleep_ms(20);                                   /* (nothing more to read: nothing more read) */
    CHECK_EQ(__atomic_load_n(&F.recvs, __ATOMIC_SEQ_CST), 400);   /* two frames each */
    CHECK_EQ(__atomic_load_n(&F.empty_reads, __ATOMIC_SEQ_CST), 0);
    char cmd[8], body[12];
    for (int i = 0; i < 200; i++) {
        CHECK_EQ(pop(&g, cmd, body), 2);
        CHECK(strcmp(cmd, "D") == 0 && strcmp(body, bodies[i]) == 0);
    }
    rig_stop(&g);
}

static void test_control_messages_wake_the_owner(void)
{
    rig g;
    rig_start(&g, 1 << 20);
    script("D", "a");
    script("C", "confirm");
    CHECK(wait_queued(&g, 2));
    CHECK(owner_woken(&g));
    CHECK_EQ(__atomic_exchange_n(&g.r.handed, 0, __ATOMIC_SEQ_CST), 1);
    rig_stop(&g);                                   /* frees what is queued */
}

static void test_stops_at_its_bound_and_goes_on_when_emptied(void)
{
    rig g;
    rig_start(&g, 64);                              /* a few messages' worth */
    static char big[40];
    memset(big, 'x', sizeof big - 1);
    for (int i = 0; i < 10; i++) script("D", big);
    sleep_ms(100);
    int first = queued(&g);
    CHECK(first >= 1 && first < 10);                /* stopped at the bound */
    CHECK(__atomic_load_n(&F.next, __ATOMIC_SEQ_CST) < 10);
    char cmd[8], body[64];
    int got = 0;
    for (int i = 0; i < 2000 && got < 10; i++) {
        if (pop(&g, cmd, body) == 2) got++;
        else sleep_ms(1);
    }
    CHECK_EQ(got, 10);                              /* all of them, as room came */
    rig_stop(&g);
}

static void test_leaves_a_held_connection_alone(void)
{
    rig g;
    rig_start(&g, 1 << 20);
    REQUIRE(fb_slock_try(&g.sl));                   /* a user thread reads it now */
    script("D", "mine");
    sleep_ms(100);
    CHECK_EQ(g.r.queued, 0);
    CHECK_EQ(__atomic_load_n(&g.r.want_wake, __ATOMIC_SEQ_CST), 1);
    fb_slock_release(&g.sl);
    fb_reader_wake(&g.r);                           /* the holder's let_go */
    CHECK(wait_queued(&g, 1));
    rig_stop(&g);
}

static void test_leaves_input_to_a_user_thread_that_reads(void)
{
    rig g;
    rig_start(&g, 1 << 20);
    fb_reader_owner_enter(&g.r);                    /* get_message() in progress */
    script("D", "mine");
    sleep_ms(100);
    CHECK_EQ(queued(&g), 0);                        /* left to the user thread... */
    CHECK_EQ(__atomic_load_n(&F.next, __ATOMIC_SEQ_CST), 0);
    fb_reader_owner_leave(&g.r);                    /* ...which went away without it */
    if (__atomic_load_n(&g.r.want_wake, __ATOMIC_SEQ_CST)) fb_reader_wake(&g.r);   /* (its let_go) */
    CHECK(wait_queued(&g, 1));                      /* taken after STEP_IN */
    script("D", "later");                           /* watching the socket again */
    CHECK(wait_queued(&g, 2));
    rig_stop(&g);
}

static void test_a_flow_pause_stops_the_sender_and_a_resume_starts_it(void)
{
    rig g;
    static int paused;
    static fb_wake sender_wake;                     /* the sender's, woken at a resume */
    int sink[2];
    REQUIRE(pipe(sink) == 0);
    REQUIRE(fb_wake_open(&sender_wake, sink[1]) == 0);
    paused = 0;
    rig_flow_paused = &paused;
    rig_flow_wake = &sender_wake;
    rig_start(&g, 1 << 20);
    script("D", "data");
    CHECK(wait_queued(&g, 1));
    CHECK_EQ(__atomic_load_n(&paused, __ATOMIC_SEQ_CST), 0);
    script("F", "p");                               /* a pause: the sender's flag, now */
    CHECK(wait_read(&g, 2));
    CHECK_EQ(__atomic_load_n(&paused, __ATOMIC_SEQ_CST), 1);
    CHECK_EQ(__atomic_load_n(&sender_wake.signaled, __ATOMIC_SEQ_CST), 0);
    CHECK_EQ(__atomic_load_n(&g.x.flow_pauses, __ATOMIC_SEQ_CST), 1);
    script("F", "p");                               /* (paused already: not counted) */
    script("F", "r");                               /* a resume: sending again, at once */
    CHECK(wait_read(&g, 4));
    CHECK_EQ(__atomic_load_n(&paused, __ATOMIC_SEQ_CST), 0);
    CHECK_EQ(__atomic_load_n(&sender_wake.signaled, __ATOMIC_SEQ_CST), 1);
    CHECK_EQ(__atomic_load_n(&g.x.flow_pauses, __ATOMIC_SEQ_CST), 1);
    CHECK_EQ(queued(&g), 1);                        /* FLOWs are taken: only the data waits */
    CHECK_EQ(__atomic_load_n(&g.r.handed, __ATOMIC_SEQ_CST), 0);   /* and the owner heard nothing */
    script("F", "p");
    CHECK(wait_read(&g, 5));
    CHECK_EQ(__atomic_load_n(&paused, __ATOMIC_SEQ_CST), 1);
    CHECK_EQ(__atomic_load_n(&g.x.flow_pauses, __ATOMIC_SEQ_CST), 2);
    script("h", "{}");                              /* a new session's WELCOME: not paused */
    CHECK(wait_queued(&g, 2));                      /* (and the owner's) */
    CHECK_EQ(__atomic_load_n(&paused, __ATOMIC_SEQ_CST), 0);
    CHECK(owner_woken(&g));
    rig_stop(&g);
    fb_wake_close(&sender_wake);
    close(sink[0]);
    close(sink[1]);
}

/* WANT [W, flags, ops, seq]: ops subscribing one key. */
static void script_want(unsigned char flags, const char *key, unsigned seq)
{
    static unsigned char store[16][64];
    static int used;
    unsigned char *b = store[used++ % 16];
    size_t k = strlen(key);
    memcpy(b, "FB\x01\x00\x01\x00\x00\x00", 8);
    b[8] = (unsigned char)k;
    b[9] = 1;
    memcpy(b + 10, key, k);
    b[10 + k] = FB_OP_F_SUBSCRIBE;
    unsigned char *f = b + 32, *s = b + 40;
    f[0] = flags;
    memset(s, 0, 8);
    s[0] = (unsigned char)seq;
    const char *frames[4] = {"W", (const char *)f, (const char *)b, (const char *)s};
    size_t lens[4] = {1, 1, 11 + k, 8};
    script_frames(4, frames, lens);
}

static int wait_wants(fb_view *v, uint64_t n)
{
    for (int i = 0; i < 2000; i++) {
        fb_lock_wait(&v->lock);
        uint64_t w = v->wants;
        fb_lock_release(&v->lock);
        if (w >= n) return 1;
        sleep_ms(1);
    }
    return 0;
}

static void test_a_want_is_applied_and_acknowledged_at_once(void)
{
    rig g;
    static fb_view view;
    fb_view_init(&view);
    fb_view_grant(&view, UINT64_MAX);               /* under a lease: acknowledge at once */
    rig_view = &view;
    rig_start(&g, 1 << 20);
    script_want(FB_WANT_RESET, "room.1", 1);
    CHECK(wait_wants(&view, 1));
    CHECK_EQ(fb_view_match(&view, "room.1", 6), 1);
    CHECK_EQ(fb_view_match(&view, "room.2", 6), 0);
    REQUIRE(fb_slock_wait(&g.sl, -1));              /* (the ACK is sent under the lock) */
    CHECK_EQ(F.sent_len, 11);                       /* [A, 1 as u64 LE] */
    CHECK(F.sent_len == 11 && F.sent[0] == 1 && F.sent[1] == 'A' && F.sent[2] == 8 && F.sent[3] == 1);
    fb_slock_release(&g.sl);
    CHECK_EQ(view.acked, 1);
    CHECK_EQ(queued(&g), 0);                        /* nothing for the owner */

    F.send_fails = 1;                               /* the socket does not take it now */
    script_want(0, "room.2", 2);
    CHECK(wait_queued(&g, 1));
    CHECK_EQ(fb_view_match(&view, "room.2", 6), 1);
    CHECK(owner_woken(&g));
    fb_reader_item *it;
    const unsigned char *frames[4];
    size_t lens[4];
    REQUIRE(fb_slock_wait(&g.sl, -1));
    CHECK_EQ(fb_reader_pop(&g.r, &it, frames, lens, 4), 2);   /* the owner sends [A, 2] */
    CHECK(lens[0] == 1 && frames[0][0] == 'A' && lens[1] == 8 && frames[1][0] == 2);
    fb_reader_release(it);
    fb_slock_release(&g.sl);
    CHECK_EQ(view.acked, 1);

    const char *bad[3] = {"W", "", "junk"};         /* malformed: the owner's to report */
    size_t bad_lens[3] = {1, 0, 4};
    script_frames(3, bad, bad_lens);
    CHECK(wait_queued(&g, 1));
    CHECK_EQ(fb_view_match(&view, "room.1", 6), 1);
    rig_stop(&g);
    fb_view_free(&view);
}

static int wait_leases(fb_view *v, uint64_t n)
{
    for (int i = 0; i < 2000; i++) {
        fb_lock_wait(&v->lock);
        uint64_t w = v->leases;
        fb_lock_release(&v->lock);
        if (w >= n) return 1;
        sleep_ms(1);
    }
    return 0;
}

static void put_u64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static void test_a_lease_pong_is_applied_at_once(void)
{
    rig g;
    static fb_view view;
    fb_view_init(&view);
    fb_view_forget(&view);                          /* a session: no lease yet */
    uint64_t t0 = fb_now_ns();
    CHECK_EQ(fb_view_ask_renewal(&view, t0, 1), 1);
    CHECK_EQ(fb_view_take_renewal(&view), 1);       /* (the sender sent its ping) */
    rig_view = &view;
    rig_start(&g, 1 << 20);
    static unsigned char token[14] = "lease:", lease[8];
    put_u64(token + 6, t0);
    put_u64(lease, 100000);                         /* 100 ms */
    const char *pong[4] = {"q", (const char *)token, "inst", (const char *)lease};
    size_t lens[4] = {1, 14, 4, 8};
    script_frames(4, pong, lens);
    CHECK(wait_leases(&view, 1));
    CHECK(fb_view_in_lease(&view, t0 + 89999999ull));   /* counted from the ping's send time */
    CHECK(!fb_view_in_lease(&view, t0 + 90000000ull));
    CHECK_EQ(view.renew, FB_VIEW_RENEW_NONE);       /* answered: the next may be asked for */
    CHECK_EQ(queued(&g), 0);                        /* nothing for the owner */

    /* Without a lease (the broker did not know the session): answered,
     * and the owner's, who sees which broker said so. */
    CHECK_EQ(fb_view_ask_renewal(&view, t0, 1), 1);
    script_frames(3, pong, lens);
    CHECK(wait_queued(&g, 1));
    CHECK_EQ(view.renew, FB_VIEW_RENEW_NONE);
    CHECK(owner_woken(&g));
    /* Other PONGs (a flush's token), and a malformed lease, are the owner's. */
    static const char flush[] = "flush-1";
    const char *other[4] = {"q", flush, "inst", (const char *)lease};
    size_t other_lens[4] = {1, 7, 4, 8};
    script_frames(4, other, other_lens);
    size_t short_lens[4] = {1, 14, 4, 7};
    script_frames(4, pong, short_lens);
    CHECK(wait_queued(&g, 3));
    CHECK_EQ(view.leases, 1);
    rig_stop(&g);
    fb_view_free(&view);
}

static uint64_t pings_sent(rig *g) { return __atomic_load_n(&g->x.pings_sent, __ATOMIC_SEQ_CST); }
static uint64_t pongs_taken(rig *g) { return __atomic_load_n(&g->x.pongs_taken, __ATOMIC_SEQ_CST); }

static void test_pings_when_due_and_takes_the_pongs_of_the_broker_it_knows(void)
{
    rig g;
    rig_ping = 1;
    rig_start(&g, 1 << 20);
    sleep_ms(110);
    uint64_t n = pings_sent(&g);
    CHECK(n >= 2 && n <= 6);                        /* every 20 ms, on its own */
    REQUIRE(fb_slock_wait(&g.sl, -1));              /* (the sends are made under the lock) */
    CHECK(F.sent_len >= 3 && F.sent[0] == 1 && F.sent[1] == 'p' && F.sent[2] == 0);   /* [p, ""] */
    fb_react_set_instance(&g.x, "inst", 4);        /* the owner read the WELCOME */
    fb_slock_release(&g.sl);

    /* A PONG naming that broker is taken: nobody else hears of it. */
    const char *pong[3] = {"q", "", "inst"};
    size_t lens[3] = {1, 0, 4};
    script_frames(3, pong, lens);
    for (int i = 0; i < 2000 && !pongs_taken(&g); i++) sleep_ms(1);
    CHECK_EQ(pongs_taken(&g), 1);
    CHECK_EQ(queued(&g), 0);
    CHECK_EQ(__atomic_load_n(&g.r.handed, __ATOMIC_SEQ_CST), 0);

    /* Another instance (the broker restarted: HELLO again) and a flush's
     * PONG are the owner's. */
    const char *other[3] = {"q", "", "new!"};
    script_frames(3, other, lens);
    const char *flush[3] = {"q", "flush-1", "inst"};
    size_t flush_lens[3] = {1, 7, 4};
    script_frames(3, flush, flush_lens);
    CHECK(wait_queued(&g, 2));
    CHECK(owner_woken(&g));
    CHECK_EQ(pongs_taken(&g), 1);

    /* A user thread that reads the connection pings it (on next_ping_ns):
     * meanwhile this thread does not. */
    fb_reader_owner_enter(&g.r);
    sleep_ms(30);                                   /* (a ping already due may still go) */
    n = pings_sent(&g);
    sleep_ms(100);
    CHECK_EQ(pings_sent(&g), n);
    fb_reader_owner_leave(&g.r);
    if (__atomic_load_n(&g.r.want_wake, __ATOMIC_SEQ_CST)) fb_reader_wake(&g.r);   /* (its let_go) */
    for (int i = 0; i < 2000 && pings_sent(&g) == n; i++) sleep_ms(1);
    CHECK(pings_sent(&g) > n);                      /* its own again */
    rig_stop(&g);
}

/* A client's inbox (fb_reader.h replies): a DATA message's batch is
 * matched to the waiting requests as it is read, not queued, and its
 * records counted; no waiter is asked to lead while the reader takes
 * them, and one is once it stops; other messages go to the owner as ever. */
static void test_replies_are_matched_as_they_are_read(void)
{
    fb_replies *t = fb_replies_new("_I.", 3, 16);
    REQUIRE(t);
    uint64_t a, b;
    REQUIRE(fb_replies_open(t, 0, &a) == FB_OK && fb_replies_open(t, 0, &b) == FB_OK);
    fb_replies_set_read_elsewhere(t, 1);
    CHECK_EQ(fb_replies_wait(t, a, fb_now_ns() + 20000000), FB_REPLY_TIMEOUT);   /* (not LEAD) */
    rig g;
    rig_replies = t;
    rig_start(&g, 1 << 20);
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    char ch[16];
    int n = snprintf(ch, sizeof ch, "_I.%llu", (unsigned long long)a);
    REQUIRE(fb_outbox_append(&o, ch, (size_t)n, "ra", 2, 0) >= 0);
    REQUIRE(fb_outbox_append(&o, "_I.999", 6, "stray", 5, 0) >= 0);
    unsigned char *batch;
    size_t blen;
    REQUIRE(fb_outbox_take(&o, &batch, &blen) == FB_OK);
    static const char seq[8] = {0};
    const char *frames[3] = {"D", seq, (const char *)batch};
    size_t lens[3] = {1, 8, blen};
    script_frames(3, frames, lens);
    script("C", "confirm");                         /* (the owner's, queued) */
    CHECK_EQ(fb_replies_wait(t, a, fb_now_ns() + 5000000000ull), FB_REPLY_DONE);
    CHECK(wait_queued(&g, 1));
    CHECK_EQ(__atomic_load_n(&g.r.replies_taken, __ATOMIC_SEQ_CST), 2);   /* the batch's two records */
    char cmd[8], body[16];
    CHECK_EQ(pop(&g, cmd, body), 2);
    CHECK(strcmp(cmd, "C") == 0);                   /* the DATA was not queued */
    fb_reply rep;
    CHECK_EQ(fb_replies_close(t, a, &rep), FB_REPLY_DONE);
    CHECK(rep.len == 2 && !memcmp(rep.buf, "ra", 2));
    fb_free(rep.buf);
    fb_replies_stats st;
    fb_replies_get_stats(t, &st);
    CHECK_EQ(st.unmatched, 1);
    rig_stop(&g);
    fb_replies_set_read_elsewhere(t, 0);            /* the reader gone: b's waiter leads */
    CHECK_EQ(fb_replies_wait(t, b, fb_now_ns() + 20000000), FB_REPLY_LEAD);
    fb_replies_unlead(t);
    fb_free(batch);
    fb_outbox_destroy(&o);
    fb_replies_free(t);
}

int main(void)
{
    RUN(test_queues_messages_in_order);
    RUN(test_a_level_triggered_socket_is_read_without_empty_reads);
    RUN(test_replies_are_matched_as_they_are_read);
    RUN(test_control_messages_wake_the_owner);
    RUN(test_stops_at_its_bound_and_goes_on_when_emptied);
    RUN(test_leaves_a_held_connection_alone);
    RUN(test_leaves_input_to_a_user_thread_that_reads);
    RUN(test_a_flow_pause_stops_the_sender_and_a_resume_starts_it);
    RUN(test_a_want_is_applied_and_acknowledged_at_once);
    RUN(test_a_lease_pong_is_applied_at_once);
    RUN(test_pings_when_due_and_takes_the_pongs_of_the_broker_it_knows);
    CTEST_END();
}
