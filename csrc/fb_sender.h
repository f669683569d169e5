/*
 * fb_sender.h - a native thread that sends the batches a publisher's burst
 * left behind, so that no message waits for a Python thread.
 *
 * A client appends each message to an fb_outbox in the publishing thread,
 * and sends the batch there too while it publishes slowly.  In a burst it
 * does not: when a batch starts it wakes this thread, and the batch
 * gathers what the publisher appends until this thread is up and has the
 * connection's lock; then the batch leaves, whatever the publishing thread
 * does next (spin in Python for a second, say).  Nothing waits for the
 * burst to end.  A Python thread would first wait for the interpreter lock
 * (up to the switch interval, 5 ms by default: the latency tail of issue
 * 22); this thread never takes it.
 *
 * It sends the outbox's batch when nothing must go before it.  What it
 * does not do it hands back to its owner (the client's Python code) by
 * writing a byte to owner_fd: control frames waiting to be sent
 * (`owner_first`), and without a reader (below), a socket without room;
 * while flow control pauses publishing (`paused`) it sends nothing.  Batches the publisher sealed
 * (full ones it could not hand over at once) it sends first, oldest first.  It holds the connection's
 * lock (fb_slock) for every use of the socket, as every other user does,
 * and the outbox's lock (fb_lock) around a take and its send, as the
 * publishing thread does around an append, so batches leave in order.
 *
 * The socket is used through function pointers: a Stream's connection
 * (fb_zmtp.h's calls, zmq.h's signatures) or a libzmq socket (the libzmq
 * that pyzmq loaded: a socket handle is valid only in the library instance
 * that made it).
 */
#ifndef FB_SENDER_H
#define FB_SENDER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "fb_batchq.h"
#include "fb_lock.h"
#include "fb_outbox.h"
#include "fb_burst.h"
#include "fb_react.h"
#include "fb_reader.h"
#include "fb_slock.h"
#include "fb_view.h"
#include "fb_wake.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The libzmq calls the sender makes (zmq.h's signatures). */
typedef struct fb_zmq_calls {
    int (*send)(void *sock, const void *buf, size_t len, int flags);
    int (*getsockopt)(void *sock, int option, void *value, size_t *len);
    int (*pending)(void *sock);  /* optional: see fb_reader.h's fb_zmq_recv_calls */
} fb_zmq_calls;


typedef struct fb_sender {
    /* Set before fb_sender_start, then only read. */
    fb_zmq_calls z;
    void *sock;                  /* guarded by *slock */
    fb_slock *slock;
    fb_outbox *outbox;           /* guarded by *outbox_lock */
    fb_lock *outbox_lock;
    fb_batchq *sealed;           /* full batches sealed before the outbox's; under *outbox_lock */
    fb_burst *burst;             /* the publisher's burst state (fb_burst.h), shared with it */
    uint64_t linger_ns;          /* a partial batch waits this long after the last send (0: none) */
    const void *command;         /* the first frame of a data message (the protocol's PUB) */
    size_t command_len;
    int owner_fd;                /* written to hand work back to the owner (fb_wake.h) */
    /* The connection's native reader (optional; set and cleared with the
     * connection's lock held, atomic): with one, this thread reads what
     * the broker said between the batches it sends (fb_reader_read_now),
     * so a FLOW pause stops it after one batch and its resume (which the
     * reader signals through `wake`) starts it again, and a full socket
     * has it look again every millisecond, reading meanwhile: a backlog
     * leaves without the owner.  Without one, input it notices and a full
     * socket are the owner's. */
    fb_reader *reader;
    /* Optional (NULL: none): the connection's reactions, whose view's
     * lease this thread renews.  When the publisher asks for a renewal
     * (its filter drops messages past half the lease: fb_view_ask_renewal,
     * then fb_sender_wake) this thread sends the lease ping
     * (fb_react_lease_ping), paused or not; the reactions apply the PONG.
     * A publisher busy in Python keeps its lease so, without a Python
     * thread.  Not while `owner_first`: the owner's control frames go
     * first (it wakes this thread after them). */
    fb_react *react;

    /* Shared with the owner (atomic). */
    int paused;                  /* flow control paused publishing (set by whoever reads the FLOW) */
    int owner_first;             /* control frames wait: the owner sends them, and what follows */
    int handed;                  /* work was handed back since the owner last cleared this */
    int owner_skipped;           /* the owner found the connection taken (by us, maybe) and
                                    sleeps without watching it: woken when we let go */
    uint64_t full_waits;         /* times it found the socket full and waited (with a reader) */
    uint64_t sent_messages;      /* records this thread sent */
    uint64_t sent_batches;
    uint64_t inline_messages;    /* records the publishing thread sent (fb_sender_send_now) */
    uint64_t inline_batches;

    /* The thread's own. */
    fb_wake wake;
    int stop;                    /* atomic */
    int running;
    pthread_t thread;
} fb_sender;

/* Start the thread (the fields above set; the counters zeroed).  0, or an
 * errno (nothing started). */
int fb_sender_start(fb_sender *s);

/* Have the thread look at the outbox now (any thread; cheap when a wake-up
 * is already pending). */
void fb_sender_wake(fb_sender *s);

/* The publishing thread's send, in C: a batch started on an idle
 * publisher, or filled (`full`), leaves from that thread at once, a hop
 * sooner than through this thread.  If the connection is free, it takes it
 * and sends what is due as this thread would (sealed batches first; a
 * lingering batch too; the publisher marked busy only if `full`), and
 * lets go, waking whoever found the connection taken meanwhile.  It never
 * waits for the outbox's lock either: its caller holds Python's
 * interpreter lock, which another publishing thread that holds the outbox's
 * may be waiting for.  What it does not do goes where this thread's would:
 * to this thread (more than a turn, a full socket, the outbox taken:
 * woken), to the owner (control frames first, input without a reader).  Paused by flow control: nothing (the resume wakes
 * the thread).  Returns the batches sent, or -1 if the connection was
 * taken (this thread is woken: it sends once it has it).  Never blocks;
 * call it only while the thread runs (it uses the thread's socket). */
int fb_sender_send_now(fb_sender *s, int full);

/* Stop the thread and wait for it; it lets go of everything first.  Safe
 * to call more than once. */
void fb_sender_stop(fb_sender *s);

#ifdef __cplusplus
}
#endif
#endif /* FB_SENDER_H */
