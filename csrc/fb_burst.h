/*
 * fb_burst.h - when a publisher's batch leaves: the burst rule and the
 * linger, written once, for the publishing thread (the Publisher) and the
 * native sender (fb_sender.h), which share one fb_burst.
 *
 * A publisher is idle when nothing was sent for gap_ns, or fewer than
 * burst_limit batches were sent since, each within gap_ns of the one
 * before: a batch that starts on an idle publisher leaves at once, from
 * the publishing thread (a hop less).  A publisher called back to back (a
 * burst) is not idle: its batch gathers while the sender thread sends the
 * one before.  A full batch, or one the sender thread sent, marks the
 * publisher busy until gap_ns passes.  With a linger, a partial batch the
 * sender thread would send waits until linger_ns after the last send.
 *
 * The fields are read and written with relaxed atomics: the publishing
 * thread and the sender may both send, and a stale read only moves one
 * batch from one to the other.
 */
#ifndef FB_BURST_H
#define FB_BURST_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_burst {
    uint64_t last_send_ns;       /* fb_now_ns of the last send (0: none yet) */
    int streak;                  /* batches sent since the last gap, at most burst_limit */
    int burst_limit;
    uint64_t gap_ns;
} fb_burst;

void fb_burst_init(fb_burst *b, uint64_t gap_ns, int burst_limit);
/* A batch was sent at now; `busy`: a full one, or one the sender thread
 * sent (the publisher is busy), else one more towards the limit. */
void fb_burst_sent(fb_burst *b, int busy, uint64_t now);
/* A batch starts at now: 1 if the publisher is idle (send it at once). */
int fb_burst_starts_idle(fb_burst *b, uint64_t now);
/* Would a batch starting at now leave at once?  (As above, changing nothing.) */
int fb_burst_idle(const fb_burst *b, uint64_t now);
/* When a partial batch may leave, with this linger: 0 for now (no linger,
 * or nothing sent yet), else the fb_now_ns time. */
uint64_t fb_burst_linger_due(const fb_burst *b, uint64_t linger_ns, uint64_t now);

#ifdef __cplusplus
}
#endif
#endif /* FB_BURST_H */
