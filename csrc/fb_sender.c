/* fb_sender.c - see fb_sender.h. */
#define _POSIX_C_SOURCE 200809L
#include "fb_sender.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>

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
/* How soon a sender that found the socket full looks again. */
#define ROOM_RETRY_NS 1000000
/* How often a sender waiting for the connection looks whether it must stop. */
#define LOCK_POLL_NS 50000000

void fb_sender_wake(fb_sender *s)
{
    fb_wake_signal(&s->wake);
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
    fb_wake_owner(&s->wake);
}

/* The socket's events, and what the broker said read first when there is
 * a reader (the lock held): a FLOW pause takes effect before the next
 * batch.  Without a reader, *unread is set: the owner reads it. */
static int look(fb_sender *s, int *unread)
{
    int ev = events(s);
    if (ev & Z_POLLIN) {
        fb_reader *r = __atomic_load_n(&s->reader, __ATOMIC_SEQ_CST);
        if (r) fb_reader_read_now(r);
        else *unread = 1;
    }
    return ev;
}

/* Nothing to send: no sealed batch, an empty outbox (a hint: a publisher
 * appending now holds the outbox's lock, and then something comes). */
static int nothing_queued(fb_sender *s)
{
    if (!fb_lock_try(s->outbox_lock)) return 0;
    unsigned char *buf;
    size_t len;
    uint32_t count;
    int empty = !fb_batchq_peek(s->sealed, &buf, &len, &count) && fb_outbox_count(s->outbox) == 0;
    fb_lock_release(s->outbox_lock);
    return empty;
}

/* Send what is due, the connection's lock held: the sealed batches, then
 * the outbox's, at most SEND_BURST.  `by_thread`: this thread's turn (a
 * lingering batch waits for its time, and every batch sent marks the
 * publisher busy); else the publishing thread's (fb_sender_send_now): the
 * outbox's batch leaves now, and the publisher is marked busy only if
 * `full` (as the owner's Publisher.sent).  Returns when to look again: now
 * (more is due after a full turn), when the outbox's batch is due by the
 * linger, a moment later (the socket was full), or UINT64_MAX: when woken;
 * adds the batches sent to *batches. */
static uint64_t send_due(fb_sender *s, int by_thread, int full, int *batches)
{
    uint64_t next = UINT64_MAX;
    int hand = 0, sent = 0, unread = 0, n;
    for (n = 0; n < SEND_BURST; n++) {
        /* (A look reads the socket: a system call, not made for nothing
         * after a batch that emptied the queue.) */
        if (n && nothing_queued(s)) break;
        /* What the broker said first (outside the outbox's lock: reading
         * applies a WANT under the view's, which a publisher takes first). */
        int ev = look(s, &unread);
        if (__atomic_load_n(&s->paused, __ATOMIC_SEQ_CST))
            break;                          /* the resume wakes us (or the owner sends) */
        if (__atomic_load_n(&s->owner_first, __ATOMIC_SEQ_CST)) {
            hand = 1;                       /* control frames go first, in order */
            break;
        }
        if (by_thread) {
            fb_lock_wait(s->outbox_lock);
        } else if (!fb_lock_try(s->outbox_lock)) {
            /* Another publishing thread appends: it may be waiting for
             * Python's interpreter lock, which our caller holds, so we
             * must not wait for it.  This thread sends (woken). */
            next = 0;
            break;
        }
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
            uint64_t due = by_thread && !fb_outbox_full(o) ? fb_burst_linger_due(s->burst, s->linger_ns, fb_now_ns()) : 0;
            if (due) {
                next = due;                     /* a lingering batch gathers until then */
                fb_lock_release(s->outbox_lock);
                break;
            }
        }
        if (!(ev & Z_POLLOUT)) {
            fb_lock_release(s->outbox_lock);
            if (__atomic_load_n(&s->reader, __ATOMIC_SEQ_CST)) {
                /* The broker is behind (its pipe to us is full): look
                 * again soon, reading it meanwhile, as the owner would. */
                next = fb_now_ns() + ROOM_RETRY_NS;
                __atomic_add_fetch(&s->full_waits, 1, __ATOMIC_SEQ_CST);
            } else {
                hand = 1;                   /* the owner waits for room, reading */
            }
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
        sent++;
        if (by_thread) {
            __atomic_add_fetch(&s->sent_messages, count, __ATOMIC_SEQ_CST);
            __atomic_add_fetch(&s->sent_batches, 1, __ATOMIC_SEQ_CST);
            /* The publisher is busy: what it publishes next gathers here. */
            fb_burst_sent(s->burst, 1, fb_now_ns());
        } else {
            __atomic_add_fetch(&s->inline_messages, count, __ATOMIC_SEQ_CST);
            __atomic_add_fetch(&s->inline_batches, 1, __ATOMIC_SEQ_CST);
        }
    }
    if (sent && !by_thread)
        fb_burst_sent(s->burst, full, fb_now_ns());   /* a full batch marks it busy */
    *batches += sent;
    /* A send may have taken the edge of libzmq's notification descriptor,
     * which the reader (or the owner) sleeps on: what the broker said
     * meanwhile (WANT, FLOW, PONG) is read now, or by the owner.  (A
     * Stream's is level-triggered, z.pending: it still says so.) */
    if (sent && !s->z.pending) look(s, &unread);
    if (hand || unread)
        hand_back(s);
    if (n == SEND_BURST && !hand)
        next = 0;                           /* more, after letting others have the lock */
    return next;
}

/* Send the lease ping the publisher asked for, if any, the lock held.
 * Returns when to try again (a socket without room), else UINT64_MAX. */
static uint64_t send_lease_ping(fb_sender *s)
{
    unsigned char token[FB_REACT_TOKEN_MAX + 8];
    /* (Counted by the reactions: fb_react.h lease_pings.) */
    if (s->react && fb_react_lease_ping(s->react, fb_now_ns(), token) < 0) return fb_now_ns() + ROOM_RETRY_NS;
    return UINT64_MAX;
}

static int renewal_wanted(fb_sender *s)
{
    fb_view *v = s->react ? s->react->view : NULL;
    return v && __atomic_load_n(&v->renew, __ATOMIC_SEQ_CST) == FB_VIEW_RENEW_WANTED;
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
        struct pollfd p = {s->wake.r, POLLIN, 0};
        if (poll(&p, 1, ms) < 0 && errno != EINTR) break;
        if (p.revents & POLLIN)
            fb_wake_clear(&s->wake);        /* before the look: a later wake writes */
        if (__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST)) break;
        due = UINT64_MAX;
        if (__atomic_load_n(&s->paused, __ATOMIC_SEQ_CST) && !renewal_wanted(s)) continue;
        /* The connection's holder may be a Python thread: wait for it (it
         * lets go without us), looking now and then whether to stop. */
        int got = 0;
        while (!(got = fb_slock_wait(s->slock, LOCK_POLL_NS)))
            if (__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST)) break;
        if (!got) break;
        /* Control frames the owner holds go first, in order: a lease ping
         * would overtake them (the owner wakes us once they are sent). */
        uint64_t ping_due = __atomic_load_n(&s->owner_first, __ATOMIC_SEQ_CST) ? UINT64_MAX : send_lease_ping(s);
        int batches = 0;
        due = send_due(s, 1, 0, &batches);  /* (sends nothing while paused) */
        if (ping_due < due) due = ping_due;
        fb_slock_release(s->slock);
        if (due == 0) sched_yield();        /* a waiter for the lock gets it first */
        /* Set before the owner's try for the lock, which failed while we
         * held it: after our release one of us sees the other. */
        if (__atomic_exchange_n(&s->owner_skipped, 0, __ATOMIC_SEQ_CST)) fb_wake_owner(&s->wake);
    }
    return NULL;
}

int fb_sender_send_now(fb_sender *s, int full)
{
    if (__atomic_load_n(&s->paused, __ATOMIC_SEQ_CST))
        return 0;                           /* the resume wakes the thread, which sends it */
    if (!fb_slock_try(s->slock)) {
        fb_sender_wake(s);                  /* it waits for the holder, then sends */
        return -1;
    }
    int batches = 0;
    uint64_t next = send_due(s, 0, full, &batches);
    fb_slock_release(s->slock);
    /* More than a turn's worth, or a full socket: the thread goes on. */
    if (next != UINT64_MAX) fb_sender_wake(s);
    /* Whoever found the connection taken meanwhile sleeps until its holder
     * lets go: the owner (owner_skipped), the reader (want_wake). */
    if (__atomic_exchange_n(&s->owner_skipped, 0, __ATOMIC_SEQ_CST)) fb_wake_owner(&s->wake);
    fb_reader *r = __atomic_load_n(&s->reader, __ATOMIC_SEQ_CST);
    if (r && __atomic_load_n(&r->want_wake, __ATOMIC_SEQ_CST)) fb_reader_wake(r);
    return batches;
}

int fb_sender_start(fb_sender *s)
{
    int rc = fb_wake_open(&s->wake, s->owner_fd);
    if (rc) return rc;
    s->stop = s->handed = s->owner_skipped = 0;
    rc = pthread_create(&s->thread, NULL, run, s);
    if (rc) {
        fb_wake_close(&s->wake);
        return rc;
    }
    s->running = 1;
    return 0;
}

void fb_sender_stop(fb_sender *s)
{
    if (!s->running) return;
    __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
    fb_wake_force(&s->wake);
    pthread_join(s->thread, NULL);
    s->running = 0;
    fb_wake_close(&s->wake);
}
