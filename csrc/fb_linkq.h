/*
 * fb_linkq.h - a link's send queue in the broker's data plane: the
 * messages its socket would not take yet (its pipe is full), in order,
 * each counted in bytes, and the records dropped from it not yet reported
 * (GAP).
 *
 * The policy that bounds a queue (slow consumers, flow control) is the
 * links' table's (fb_links.h; described in fastbus/broker/sending.py);
 * here are the entries and the operations on
 * one queue, which touch no socket.  Two rules live here:
 *
 * - Data may be dropped to fit a bound (fb_linkq_drop_data), the oldest
 *   first and counted exactly in `lost`, never the newest batch; control
 *   messages never are (the protocol breaks without them).
 * - A control message that a later one of its kind makes moot (a WANT
 *   reset, a FLOW) collapses into one mark per kind (fb_linkq_collapse),
 *   where the first such message waited: what goes when the mark reaches
 *   the head is built then, from the state at that time.  So a flood of
 *   them is bounded without losing the last word.
 *
 * Messages are libzmq's zmq_msg_t (the relay sends them with zero copy),
 * made and closed through the calls the caller gives (fb_zmq_msg_calls: the
 * libzmq that pyzmq loaded, or a test's).  Not thread-safe: the data
 * plane's thread.
 */
#ifndef FB_LINKQ_H
#define FB_LINKQ_H

#include <stddef.h>
#include <stdint.h>

#include "fb_zmq_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The message calls a queue makes (zmq.h's signatures). */
typedef struct fb_zmq_msg_calls {
    int (*init)(fb_zmq_msg *msg);
    int (*init_size)(fb_zmq_msg *msg, size_t size);
    int (*close)(fb_zmq_msg *msg);
    void *(*data)(fb_zmq_msg *msg);
    /* A message that takes `data` without a copy, `ffn(data, hint)` called
     * when it is done with it (zmq_msg_init_data). */
    int (*init_data)(fb_zmq_msg *msg, void *data, size_t size, void (*ffn)(void *data, void *hint), void *hint);
} fb_zmq_msg_calls;

/* An entry's kind. */
enum {
    FB_Q_FRAMES = 0,             /* frames to send as they are: data (records > 0) or a control message */
    FB_Q_WANT_MARK = 1,          /* a WANT reset, built by its owner when the mark reaches the head */
    FB_Q_FLOW_MARK = 2           /* FLOW with the state at the time it goes */
};

/* fb_linkq.marks */
enum {
    FB_Q_MARK_WANT = 1,          /* it holds a WANT mark ... */
    FB_Q_MARK_FLOW = 2           /* ... a FLOW mark */
};

/* What one queued message costs beyond its frames (the entry and its
 * messages), counted in the queue's bytes so that a flood of small
 * control messages is bounded by the queue's limit as data is. */
#define FB_Q_ENTRY_BYTES 256

typedef struct fb_qentry {
    struct fb_qentry *next;
    uint64_t records;            /* data records (0: a control message or a mark) */
    size_t size;                 /* what it counts against the queue's limit */
    uint32_t done;               /* records already sent (a link that sends a message per record) */
    uint8_t kind;                /* FB_Q_* */
    uint8_t cmd;                 /* a control message's command byte (WANT and FLOW collapse) */
    uint8_t nframes;
    fb_zmq_msg frames[1];           /* nframes of them (allocated so) */
} fb_qentry;

typedef struct fb_linkq {
    fb_qentry *head;
    fb_qentry *tail;
    size_t bytes;
    uint64_t lost;               /* data records dropped, not yet reported */
    uint8_t marks;               /* FB_Q_MARK_*: the marks it holds */
} fb_linkq;

/* An entry for `nframes` messages (0 to 255, each initialised empty), its
 * size FB_Q_ENTRY_BYTES; NULL for want of memory. */
fb_qentry *fb_qentry_new(const fb_zmq_msg_calls *z, int nframes);

/* Close an entry's messages (those not sent) and free it. */
void fb_qentry_free(const fb_zmq_msg_calls *z, fb_qentry *e);

/* Frame i a copy of `n` bytes at `data` (counted in its size); 0, or -1
 * for want of memory (the frame left empty). */
int fb_qentry_frame(const fb_zmq_msg_calls *z, fb_qentry *e, int i, const void *data, size_t n);

/* Frame i takes `buf` (`n` bytes, the core's allocation: fb_free frees
 * it once the frame is sent or closed) without a copy, counted in the
 * entry's size; 0, or -1 (the frame left as it was, `buf` still the
 * caller's). */
int fb_qentry_own(const fb_zmq_msg_calls *z, fb_qentry *e, int i, unsigned char *buf, size_t n);

/* Append an entry (the queue's now), counting its size. */
void fb_linkq_push(fb_linkq *q, fb_qentry *e);

/* Put an entry at the head, ahead of everything (counting its size). */
void fb_linkq_push_front(fb_linkq *q, fb_qentry *e);

/* Free the head entry (there must be one). */
void fb_linkq_pop(const fb_zmq_msg_calls *z, fb_linkq *q);

/* Free every entry; empty, as new. */
void fb_linkq_clear(const fb_zmq_msg_calls *z, fb_linkq *q);

/* Drop the oldest data entries (none partly sent) until the queue holds at
 * most `limit` bytes; control messages and marks stay, and so does the
 * newest data entry (a batch larger than the bound by itself: what a
 * consumer that falls behind gets is always the newest, and the queue's
 * bound is `limit` and one batch).  The records dropped, also added to
 * `lost`. */
uint64_t fb_linkq_drop_data(const fb_zmq_msg_calls *z, fb_linkq *q, size_t limit);

/* A control message of command `cmd` that a later one of its kind makes
 * moot is to be queued: make sure the queue holds one mark of `kind` for
 * it (flag `mark` in marks), where the first such message waits, and
 * nothing else of its command.  1, or 0 for want of memory (then nothing
 * changed). */
int fb_linkq_collapse(const fb_zmq_msg_calls *z, fb_linkq *q, uint8_t cmd, uint8_t mark, uint8_t kind);

#ifdef __cplusplus
}
#endif
#endif /* FB_LINKQ_H */
