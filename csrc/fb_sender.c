/* fb_sender.c - see fb_sender.h. */
#define _POSIX_C_SOURCE 200809L
#include "fb_sender.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "fb_common.h"

/* zmq.h's values (stable across libzmq 4.x). */
#define Z_DONTWAIT 1
#define Z_SNDMORE 2
#define Z_EVENTS 15
#define Z_POLLIN 1
#define Z_POLLOUT 2

/* Batches sent in one turn before the lock is let go (the owner may be
 * waiting for it: a FLOW pause to read, a subscribe to send). */
#define SEND_BURST 32
/* How often a sender waiting for the connection looks whether it must stop. */
#define LOCK_POLL_NS 50000000

static void poke(int fd)
{
    char b = 0;
    ssize_t r = write(fd, &b, 1);
    (void)r;   /* a full pipe is a wake-up already pending */
}

void fb_sender_wake(fb_sender *s)
{
    if (!__atomic_exchange_n(&s->signaled, 1, __ATOMIC_SEQ_CST)) poke(s->wake_w);
}

static int events(fb_sender *s)
{
    int ev = 0;
    size_t n = sizeof ev;
    if (s->z.getsockopt(s->sock, Z_EVENTS, &ev, &n) != 0) return 0;
    return ev;
}

static void hand_back(fb_sender *s)
{
    __atomic_store_n(&s->handed, 1, __ATOMIC_SEQ_CST);
    poke(s->owner_fd);
}

/* Send what is due, the connection's lock held.  Returns when the outbox's
 * batch is next due by the linger (UINT64_MAX: when woken). */
static uint64_t send_due(fb_sender *s)
{
    uint64_t next = UINT64_MAX;
    int hand = 0, sent = 0;
    for (int n = 0; n < SEND_BURST; n++) {
        if (__atomic_load_n(&s->paused, __ATOMIC_SEQ_CST))
            break;                          /* FLOW resume: the owner sends */
        if (__atomic_load_n(&s->owner_first, __ATOMIC_SEQ_CST)) {
            hand = 1;                       /* control frames go first, in order */
            break;
        }
        fb_lock_wait(s->outbox_lock);
        fb_outbox *o = s->outbox;
        unsigned char *buf = NULL;
        size_t len = 0;
        uint32_t count = 0;
        int from_sealed = fb_batchq_peek(s->sealed, &buf, &len, &count);
        if (!from_sealed) {
            count = (uint32_t)fb_outbox_count(o);
            if (!count) {
                fb_lock_release(s->outbox_lock);
                break;
            }
            uint64_t last = __atomic_load_n(s->last_send_ns, __ATOMIC_RELAXED);
            if (s->linger_ns && !fb_outbox_full(o) && fb_now_ns() < last + s->linger_ns) {
                next = last + s->linger_ns;     /* a lingering batch gathers until then */
                fb_lock_release(s->outbox_lock);
                break;
            }
        }
        if (!(events(s) & Z_POLLOUT)) {
            fb_lock_release(s->outbox_lock);
            hand = 1;                       /* the owner waits for room (and counts it blocked) */
            break;
        }
        if (!from_sealed && (fb_outbox_take(o, &buf, &len) < 0 || !buf)) {
            fb_lock_release(s->outbox_lock);
            hand = 1;
            break;
        }
        /* Sent under the outbox's lock: a failed send goes back before
         * anything is appended behind it (a sealed batch was only looked
         * at).  After POLLOUT the first frame is taken, and once it is,
         * ZeroMQ takes the rest of the message. */
        if (s->z.send(s->sock, s->command, s->command_len, Z_DONTWAIT | Z_SNDMORE) < 0) {
            if (!from_sealed && fb_outbox_untake(o, buf, len, count) < 0)
                fb_free(buf);               /* cannot happen: the outbox was held throughout */
            fb_lock_release(s->outbox_lock);
            hand = 1;
            break;
        }
        int rc = s->z.send(s->sock, buf, len, Z_DONTWAIT);
        if (from_sealed) fb_batchq_pop(s->sealed, &buf, &len, &count);
        fb_lock_release(s->outbox_lock);
        fb_free(buf);
        if (rc < 0) {
            hand = 1;                       /* the socket is closing: the owner sees why */
            break;
        }
        sent = 1;
        __atomic_add_fetch(&s->sent_messages, count, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&s->sent_batches, 1, __ATOMIC_SEQ_CST);
        /* The publisher is busy: what it publishes next gathers here. */
        __atomic_store_n(s->last_send_ns, fb_now_ns(), __ATOMIC_RELAXED);
        __atomic_store_n(s->streak, s->burst_limit, __ATOMIC_RELAXED);
    }
    /* A send may have taken the edge of the socket's notification
     * descriptor the owner sleeps on: if the broker said something
     * meanwhile (WANT, FLOW, PONG), the owner reads it. */
    if (hand || (sent && (events(s) & Z_POLLIN)))
        hand_back(s);
    return next;
}

static void *run(void *arg)
{
    fb_sender *s = arg;
    uint64_t due = UINT64_MAX;
    for (;;) {
        int ms = -1;
        if (due != UINT64_MAX) {
            uint64_t now = fb_now_ns();
            ms = due <= now ? 0 : (int)((due - now + 999999) / 1000000);
        }
        struct pollfd p = {s->wake_r, POLLIN, 0};
        if (poll(&p, 1, ms) < 0 && errno != EINTR) break;
        char drain[64];
        while (read(s->wake_r, drain, sizeof drain) > 0) {
        }
        __atomic_store_n(&s->signaled, 0, __ATOMIC_SEQ_CST);   /* before the look: a later wake writes */
        if (__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST)) break;
        due = UINT64_MAX;
        if (__atomic_load_n(&s->paused, __ATOMIC_SEQ_CST)) continue;
        /* The connection's holder may be a Python thread: wait for it (it
         * lets go without us), looking now and then whether to stop. */
        int got = 0;
        while (!(got = fb_slock_wait(s->slock, LOCK_POLL_NS)))
            if (__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST)) break;
        if (!got) break;
        due = send_due(s);
        fb_slock_release(s->slock);
        /* Set before the owner's try for the lock, which failed while we
         * held it: after our release one of us sees the other. */
        if (__atomic_exchange_n(&s->owner_skipped, 0, __ATOMIC_SEQ_CST)) poke(s->owner_fd);
    }
    return NULL;
}

static int nonblocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int fb_sender_start(fb_sender *s)
{
    int fds[2];
    if (pipe(fds) != 0) return errno;
    if (nonblocking(fds[0]) || nonblocking(fds[1]) || fcntl(fds[0], F_SETFD, FD_CLOEXEC) < 0 ||
            fcntl(fds[1], F_SETFD, FD_CLOEXEC) < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return e;
    }
    /* Our own copy of the owner's descriptor: the owner may close its own
     * before this thread stops (a number reused meanwhile would get our
     * bytes). */
    int owner = fcntl(s->owner_fd, F_DUPFD_CLOEXEC, 0);
    if (owner < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return e;
    }
    s->owner_fd = owner;
    s->wake_r = fds[0];
    s->wake_w = fds[1];
    s->signaled = s->stop = 0;
    s->handed = s->owner_skipped = 0;
    int rc = pthread_create(&s->thread, NULL, run, s);
    if (rc) {
        close(fds[0]);
        close(fds[1]);
        close(owner);
        s->wake_r = s->wake_w = -1;
        return rc;
    }
    s->running = 1;
    return 0;
}

void fb_sender_stop(fb_sender *s)
{
    if (!s->running) return;
    __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
    poke(s->wake_w);
    pthread_join(s->thread, NULL);
    s->running = 0;
    close(s->wake_r);
    close(s->wake_w);
    close(s->owner_fd);
    s->wake_r = s->wake_w = s->owner_fd = -1;
}
