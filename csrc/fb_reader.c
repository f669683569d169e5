/* fb_reader.c - see fb_reader.h. */
#define _POSIX_C_SOURCE 200809L
#include "fb_reader.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fb_batch.h"
#include "fb_common.h"

/* zmq.h's values (stable across libzmq 4.x). */
#define Z_DONTWAIT 1
#define Z_SNDMORE 2
#define Z_EVENTS 15
#define Z_POLLIN 1

/* How long after a user thread stopped reading this one takes over. */
#define STEP_IN_NS 200000
/* Parked, how often it looks whether a user thread still reads... */
#define PARK_CHECK_MS 5
/* ...and after how long of one staying in, it sleeps until let go of. */
#define DEEP_PARK_NS 20000000
/* How soon it tries again for a lock it found taken. */
#define RETRY_MS 1

/* A queued message: its frames, each as a 4-byte length and the bytes. */
struct fb_reader_item {
    fb_reader_item *next;
    size_t nframes;
    size_t len, cap;             /* of data */
    unsigned char *data;
};

void fb_reader_wake(fb_reader *r)
{
    fb_wake_signal(&r->wake);
}

void fb_reader_owner_enter(fb_reader *r)
{
    __atomic_add_fetch(&r->owner_in, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&r->owner_recent, 1, __ATOMIC_SEQ_CST);
}

void fb_reader_owner_leave(fb_reader *r)
{
    __atomic_store_n(&r->owner_left_ns, fb_now_ns(), __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&r->owner_in, 1, __ATOMIC_SEQ_CST);
}

static int has_input(fb_reader *r)
{
    int ev = 0;
    size_t n = sizeof ev;
    return r->z.getsockopt(r->sock, Z_EVENTS, &ev, &n) == 0 && (ev & Z_POLLIN);
}

static void item_free(fb_reader_item *it)
{
    if (!it) return;
    free(it->data);
    free(it);
}

static int item_add(fb_reader_item *it, const void *frame, size_t size)
{
    if (size > UINT32_MAX) return FB_ETOOBIG;
    size_t need = it->len + 4 + size;
    if (need > it->cap) {
        size_t cap = it->cap ? it->cap : 256;
        while (cap < need) cap *= 2;
        unsigned char *d = realloc(it->data, cap);
        if (!d) return FB_ENOMEM;
        it->data = d;
        it->cap = cap;
    }
    uint32_t n = (uint32_t)size;
    memcpy(it->data + it->len, &n, 4);
    if (size) memcpy(it->data + it->len + 4, frame, size);
    it->len = need;
    it->nframes++;
    return FB_OK;
}

/* The frames of a queued message (at most max), for fb_react_message. */
static size_t item_frames(const fb_reader_item *it, const unsigned char **frames, size_t *lens, size_t max)
{
    size_t off = 0, i = 0;
    for (; i < it->nframes && i < max; i++) {
        uint32_t n;
        memcpy(&n, it->data + off, 4);
        frames[i] = it->data + off + 4;
        lens[i] = n;
        off += 4 + (size_t)n;
    }
    return i;
}

/* The reactions to a message read (fb_react.h), the lock held.  Returns
 * what to queue for the owner: the message itself if it is the owner's,
 * NULL if it was taken (and freed), or an ACK due that the socket did not
 * take (the owner sends it its own way; without memory for that, the next
 * lease acknowledges it, fb_view_grant, or the broker's wait for a lease
 * to run out confirms without it). */
static fb_reader_item *react(fb_reader *r, fb_reader_item *it)
{
    const unsigned char *frames[FB_REACT_FRAMES_MAX];
    size_t lens[FB_REACT_FRAMES_MAX];
    uint64_t ack = 0;
    if (!r->react) return it;
    item_frames(it, frames, lens, FB_REACT_FRAMES_MAX);
    int fate = fb_react_message(r->react, it->nframes, frames, lens, &ack);
    if (fate == FB_REACT_OWNER) return it;
    item_free(it);
    if (fate == FB_REACT_TAKEN) return NULL;
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(ack >> (8 * i));
    fb_reader_item *a = calloc(1, sizeof *a);
    const fb_react *x = r->react;
    if (a && item_add(a, x->ack_command, x->ack_command_len) == FB_OK && item_add(a, b, 8) == FB_OK) return a;
    item_free(a);
    return NULL;
}

/* A data message for the inbox (fb_reader.h replies): its batch to the
 * waiting requests, its records counted as the owner's _took counts them
 * (the header's count, 1 for a batch without one). */
static void take_replies(fb_reader *r, const fb_reader_item *it)
{
    const unsigned char *frames[3];
    size_t lens[3];
    uint32_t count = 0;
    if (item_frames(it, frames, lens, 3) == 3 && it->nframes == 3) {
        fb_replies_take(r->replies, frames[2], lens[2]);
        if (fb_batch_header(frames[2], lens[2], &count, NULL) != FB_OK) count = 0;
    }
    __atomic_add_fetch(&r->replies_taken, count ? count : 1, __ATOMIC_SEQ_CST);
}

/* The connection went (lost): [lost_command] for the owner, queued
 * behind what was read before.  1 if queued. */
static int queue_lost(fb_reader *r)
{
    if (!r->lost || !r->lost_command || !r->lost(r->sock)) return 0;
    fb_reader_item *it = calloc(1, sizeof *it);
    if (!it || item_add(it, r->lost_command, r->lost_command_len) < 0) {
        item_free(it);
        return 1;                /* (no memory: the owner's own read asks no more; woken anyway) */
    }
    if (r->tail) r->tail->next = it;
    else r->head = it;
    r->tail = it;
    r->queued++;
    r->queued_bytes += it->len;
    return 1;
}

static int read_messages(fb_reader *r);

static int read_some(fb_reader *r)
{
    int notify = read_messages(r);
    return queue_lost(r) || notify;
}

/* Read whole messages into the queue while it has room, the lock held.
 * Returns 1 if a message the owner must see (not data) was queued. */
static int read_messages(fb_reader *r)
{
    int notify = 0;
    for (int first = 1; r->queued_bytes < r->max_bytes; first = 0) {
        /* After the first message, a level-triggered socket says without a
         * read whether more waits (after a short read the poll says when). */
        if (!first && r->z.pending ? !r->z.pending(r->sock) : !has_input(r)) break;
        fb_reader_item *it = calloc(1, sizeof *it);
        int ok = it != NULL, more = 1, is_data = 0;
        fb_zmq_msg m;
        while (more) {
            r->z.msg_init(&m);
            if (r->z.msg_recv(&m, r->sock, Z_DONTWAIT) < 0) {
                /* EAGAIN only before a message's first frame (ZeroMQ
                 * delivers a message whole); anything else: the socket
                 * is closing, and the owner sees why. */
                r->z.msg_close(&m);
                if (it && it->nframes == 0) {
                    item_free(it);
                    return notify;
                }
                ok = 0;
                break;
            }
            const void *d = r->z.msg_data(&m);
            size_t size = r->z.msg_size(&m);
            if (ok && it->nframes == 0)
                is_data = size == r->data_command_len && memcmp(d, r->data_command, size) == 0;
            if (ok && item_add(it, d, size) < 0) ok = 0;
            more = r->z.msg_more(&m);
            r->z.msg_close(&m);
        }
        if (!ok) {
            /* No memory for it (or a broken read): the owner reads from
             * here on, and its own errors say what happened. */
            item_free(it);
            notify = 1;
            r->max_bytes = 0;
            break;
        }
        __atomic_add_fetch(&r->read_messages, 1, __ATOMIC_SEQ_CST);
        if (is_data && r->replies) {
            take_replies(r, it);
            item_free(it);
            continue;
        }
        if (!is_data && !(it = react(r, it))) continue;
        if (r->tail) r->tail->next = it;
        else r->head = it;
        r->tail = it;
        r->queued++;
        r->queued_bytes += it->len;
        if (!is_data || r->wake_on_data) notify = 1;
    }
    return notify;
}

static void tell_owner(fb_reader *r)
{
    __atomic_store_n(&r->handed, 1, __ATOMIC_SEQ_CST);
    fb_wake_owner(&r->wake);
}

void fb_reader_read_now(fb_reader *r)
{
    /* (The lock is the caller's: an owner woken now and finding it taken
     * is woken again by the caller's letting go, fb_sender.h owner_skipped.) */
    if (read_some(r)) tell_owner(r);
}

/* Parked (a user thread reads, or did within STEP_IN): how long to sleep
 * before looking again, -1 for until woken; 0 once it is time to read. */
static int park_timeout(fb_reader *r, uint64_t parked_since)
{
    uint64_t now = fb_now_ns();
    if (__atomic_load_n(&r->owner_in, __ATOMIC_SEQ_CST)) {
        if (now - parked_since < DEEP_PARK_NS) return PARK_CHECK_MS;
        /* In for long (blocked, nothing arriving): its letting go of the
         * lock wakes us (fb_reader_wake through want_wake). */
        __atomic_store_n(&r->want_wake, 1, __ATOMIC_SEQ_CST);
        return __atomic_load_n(&r->owner_in, __ATOMIC_SEQ_CST) ? -1 : 0;
    }
    uint64_t left = __atomic_load_n(&r->owner_left_ns, __ATOMIC_SEQ_CST);
    if (now - left < STEP_IN_NS) return 1;          /* (ms: poll's unit) */
    /* Away for STEP_IN: ours, unless it came back meanwhile. */
    __atomic_store_n(&r->owner_recent, 0, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&r->owner_in, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&r->owner_recent, 1, __ATOMIC_SEQ_CST);
        return PARK_CHECK_MS;
    }
    return 0;
}

static void *run(void *arg)
{
    fb_reader *r = arg;
    int watch_socket = 1, retry = 0;
    uint64_t parked_since = 0;
    for (;;) {
        /* The socket's descriptor only while we may read it and no user
         * thread does: a holder that has the lock leaves it readable
         * (unprocessed commands) until it acts, and would have us spin. */
        int parked = watch_socket && __atomic_load_n(&r->owner_recent, __ATOMIC_SEQ_CST);
        /* The lock was taken: a Python holder wakes us when it lets go
         * (want_wake), the native sender does not: look again soon.  Else
         * until input, a wake, or the liveness ping (a user thread that
         * reads sends it while we are parked). */
        int timeout = retry ? RETRY_MS : r->react ? fb_react_ping_wait_ms(r->react, fb_now_ns()) : -1;
        retry = 0;
        if (parked) {
            if (!parked_since) parked_since = fb_now_ns();
            timeout = park_timeout(r, parked_since);
            if (timeout == 0) parked = 0;           /* ours now: read what it left */
        }
        if (timeout != 0) {
            struct pollfd p[2] = {{r->wake.r, POLLIN, 0}, {r->sock_fd, POLLIN, 0}};
            int n = poll(p, watch_socket && !parked ? 2 : 1, timeout);
            if (n < 0 && errno != EINTR) break;
            /* (Emptied only when it holds a byte: a wake that comes later
             * writes one, and an empty pipe costs a read for nothing.) */
            if (p[0].revents & POLLIN) fb_wake_clear(&r->wake);
            if (__atomic_load_n(&r->stop, __ATOMIC_SEQ_CST)) break;
            if (parked) {
                if (!(p[0].revents & POLLIN)) continue;   /* time to look again */
                /* Woken: the user thread let go (want_wake), or more input
                 * was left for us: look again from the top. */
                __atomic_store_n(&r->want_wake, 0, __ATOMIC_SEQ_CST);
                parked_since = fb_now_ns();
                continue;
            }
            if (watch_socket && !(p[0].revents & POLLIN) && (p[1].revents & POLLIN) &&
                __atomic_load_n(&r->owner_recent, __ATOMIC_SEQ_CST)) {
                /* Input, and a user thread reads now (or did a moment ago):
                 * it takes it; park instead of contending. */
                __atomic_add_fetch(&r->parks, 1, __ATOMIC_SEQ_CST);
                parked_since = 0;
                continue;
            }
        }
        parked_since = 0;
        __atomic_store_n(&r->want_wake, 1, __ATOMIC_SEQ_CST);
        if (!fb_slock_try(r->slock)) {
            watch_socket = 0;           /* until the holder wakes us (or RETRY_MS) */
            retry = 1;
            continue;
        }
        __atomic_store_n(&r->want_wake, 0, __ATOMIC_SEQ_CST);
        if (r->react) fb_react_ping_if_due(r->react, fb_now_ns());
        int notify = read_some(r);
        /* Full: the owner's reads make room, and it wakes us when it lets go. */
        watch_socket = r->queued_bytes < r->max_bytes;
        if (!watch_socket) __atomic_store_n(&r->want_wake, 1, __ATOMIC_SEQ_CST);
        fb_slock_release(r->slock);
        if (notify) tell_owner(r);      /* after letting go: the owner wants the lock */
    }
    return NULL;
}

int fb_reader_start(fb_reader *r)
{
    int rc = fb_wake_open(&r->wake, r->owner_fd);
    if (rc) return rc;
    r->stop = r->want_wake = r->handed = 0;
    r->owner_in = r->owner_recent = 0;
    r->owner_left_ns = r->parks = 0;
    r->head = r->tail = NULL;
    r->queued = r->queued_bytes = 0;
    rc = pthread_create(&r->thread, NULL, run, r);
    if (rc) {
        fb_wake_close(&r->wake);
        return rc;
    }
    r->running = 1;
    return 0;
}

void fb_reader_stop(fb_reader *r)
{
    if (!r->running) return;
    __atomic_store_n(&r->stop, 1, __ATOMIC_SEQ_CST);
    fb_wake_force(&r->wake);
    pthread_join(r->thread, NULL);
    r->running = 0;
    fb_wake_close(&r->wake);
    while (r->head) {
        fb_reader_item *it = r->head;
        r->head = it->next;
        item_free(it);
    }
    r->tail = NULL;
    r->queued = r->queued_bytes = 0;
}

size_t fb_reader_pop(fb_reader *r, fb_reader_item **item, const unsigned char **frames, size_t *lens,
                     size_t max_frames)
{
    fb_reader_item *it = r->head;
    *item = it;
    if (!it) return 0;
    r->head = it->next;
    if (!r->head) r->tail = NULL;
    r->queued--;
    r->queued_bytes -= it->len;
    item_frames(it, frames, lens, max_frames);
    return it->nframes;
}

void fb_reader_release(fb_reader_item *item)
{
    item_free(item);
}
