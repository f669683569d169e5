/*
 * fb_reader.h - a native thread that reads a subscriber's connection while
 * no user thread does, so the broker is never held back by a subscriber
 * that is merely busy in Python between two reads.
 *
 * A thread in get_message()/get_batch() reads the socket itself (no
 * hand-over on the way to the caller).  Between two such calls, somebody
 * must keep taking what arrives, or it piles up at the broker, which then
 * pauses every publisher (flow control) or drops (a slow consumer).  A
 * Python thread doing that waits for the interpreter lock first, while the
 * user's thread holds it; this one never takes it.  It takes whole
 * messages off the socket into a queue (fb_reader_pop hands them over,
 * oldest first), up to max_bytes, and leaves everything else to its owner:
 * a message that is not data (a confirmation, a PONG, a notice) wakes the
 * owner (owner_fd), which then reads the queue in order.
 *
 * While a user thread reads (between fb_reader_owner_enter and _leave, and
 * for STEP_IN after it left) the thread does not watch the socket at all:
 * the user's read takes what arrives, and two threads woken by one
 * message cost the CPU that the message's latency is made of (2 cores).
 * Entering and leaving are memory stores (a syscall per message, such as
 * arming a timer, costs microseconds in a VM).  Parked, the thread looks
 * at the time every PARK_CHECK; once no user thread was in for STEP_IN it
 * reads what was left and watches the socket again.  A user thread that
 * stays in a long time (blocked waiting, nothing arriving) has it sleep
 * until that thread lets go of the connection (want_wake), so an idle
 * subscriber wakes nobody.

 * It holds the connection's lock (fb_slock) while it reads, as every user
 * of the socket does; the queue is guarded by the same lock (its owner
 * pops with the lock held).  When it finds the lock taken it sleeps until
 * the holder lets go and calls fb_reader_wake (it sets want_wake first,
 * so the holder knows to); the same when its queue is full.
 */
#ifndef FB_READER_H
#define FB_READER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "fb_react.h"
#include "fb_replies.h"
#include "fb_slock.h"
#include "fb_wake.h"
#include "fb_zmq_msg.h"

#ifdef __cplusplus
extern "C" {
#endif


/* The libzmq calls the reader makes (zmq.h's signatures). */
typedef struct fb_zmq_recv_calls {
    int (*msg_init)(fb_zmq_msg *msg);
    int (*msg_recv)(fb_zmq_msg *msg, void *sock, int flags);
    void *(*msg_data)(fb_zmq_msg *msg);
    size_t (*msg_size)(const fb_zmq_msg *msg);
    int (*msg_more)(const fb_zmq_msg *msg);
    int (*msg_close)(fb_zmq_msg *msg);
    int (*getsockopt)(void *sock, int option, void *value, size_t *len);
    int (*send)(void *sock, const void *buf, size_t len, int flags);   /* (the engine's sends: fb_react.h send) */
    /* Optional (NULL for libzmq): a socket whose descriptor is
     * level-triggered (a Stream, fb_zmtp.h) says whether input waits
     * without asking the kernel again: a whole message buffered, or the
     * last read filled its room.  After a short read the descriptor itself
     * says when more comes, so a reader stops there instead of making a
     * read that finds nothing; and a send never hides input from the
     * descriptor (libzmq's ZMQ_FD is edge-triggered: after a send its
     * owner must look). */
    int (*pending)(void *sock);
} fb_zmq_recv_calls;

typedef struct fb_reader_item fb_reader_item;

typedef struct fb_reader {
    /* Set before fb_reader_start, then only read. */
    fb_zmq_recv_calls z;
    void *sock;                  /* guarded by *slock */
    int sock_fd;                 /* the socket's ZMQ_FD */
    fb_slock *slock;
    size_t max_bytes;            /* stop reading while the queue holds this much */
    const void *data_command;    /* the first frame of a data message (the protocol's DATA) */
    size_t data_command_len;
    int owner_fd;                /* written when a message the owner must see arrived (fb_wake.h) */
    int wake_on_data;            /* data too wakes the owner: an event loop, which reads only
                                    when woken (a user thread reads the socket itself) */
    /* Optional (NULL: none): the connection's reactions (fb_react.h),
     * applied to each message that is not data the moment it is read; what
     * they take is not queued (a FLOW, a WANT and its ACK, a lease PONG, a
     * liveness PONG of the known broker, a TOOK), so a client in its steady
     * state wakes no Python thread.  An ACK due that the socket did not
     * take is queued for the owner as the message [ack_command, seq u64
     * LE], to send its own way.  The thread also sends the liveness ping
     * when it is due (fb_react_ping_if_due), as does a user thread that
     * reads while the thread leaves the socket to it. */
    fb_react *react;
    /* Optional (lost NULL: none): lost(sock) is 1 once for each connection
     * that went (fb_zmtp_take_lost); the thread then queues a message of
     * one frame, lost_command, and wakes the owner: a subscriber hears of
     * a cut when it happens, not when the broker is back. */
    const void *lost_command;
    size_t lost_command_len;
    int (*lost)(void *sock);
    /* Optional (NULL: none): a client's inbox (fb_replies.h).  Each data
     * message [data_command, seq, batch] is matched to the waiting
     * requests the moment it is read (fb_replies_take, which wakes their
     * threads) and not queued, so no thread needs the interpreter lock,
     * nor to read the socket, for a reply to reach its request; the
     * records those batches held are added to replies_taken, for the
     * owner to tell the broker (its TAKEN, in its own time). */
    fb_replies *replies;

    /* Shared with the owner (atomic). */
    int want_wake;               /* the lock was taken, or the queue full: whoever lets go of
                                    the lock next wakes us (fb_reader_wake) */
    int handed;                  /* a non-data message was queued since the owner last cleared this */
    uint64_t read_messages;      /* messages this thread read */
    int owner_in;                /* user threads reading now (fb_reader_owner_enter/_leave) */
    int owner_recent;            /* one was, lately: leave the socket to them (set by enter,
                                    cleared by this thread STEP_IN after the last leave) */
    uint64_t owner_left_ns;      /* when the last one left (fb_now_ns) */
    uint64_t parks;              /* times this thread, woken by input, left it to a user thread */
    uint64_t replies_taken;      /* records of the data messages handed to replies */

    /* The queue: guarded by *slock. */
    fb_reader_item *head, *tail;
    size_t queued, queued_bytes;

    /* The thread's own. */
    fb_wake wake;
    int stop, running;
    pthread_t thread;
} fb_reader;

/* Start the thread (the fields above set).  0, or an errno. */
int fb_reader_start(fb_reader *r);
void fb_reader_wake(fb_reader *r);
/* A user thread starts / stops reading the connection (any thread; the
 * lock need not be held; no syscall). */
void fb_reader_owner_enter(fb_reader *r);
void fb_reader_owner_leave(fb_reader *r);
/* Read what the connection has now, as the thread would (into the queue,
 * the reactions applied, the owner woken for what it must see),
 * the lock held by the caller.  The native sender calls it between the
 * batches it sends (fb_sender.h `reader`): a FLOW pause then stops it
 * after one batch, and no input waits behind a long burst. */
void fb_reader_read_now(fb_reader *r);
/* Stop the thread, wait for it, and free what is still queued.  Safe to
 * call more than once. */
void fb_reader_stop(fb_reader *r);

/* The oldest queued message, the lock held: its frames' count, and for
 * each frame i, frames[i] / lens[i] (views valid until fb_reader_release);
 * 0 if the queue is empty.  At most max_frames frames are described (a
 * message with more is still released whole).  The item goes to *item, to
 * hand to fb_reader_release once the frames were copied. */
size_t fb_reader_pop(fb_reader *r, fb_reader_item **item, const unsigned char **frames, size_t *lens,
                     size_t max_frames);
void fb_reader_release(fb_reader_item *item);

#ifdef __cplusplus
}
#endif
#endif /* FB_READER_H */
