/*
 * fb_batchq.h - a queue of encoded batches waiting to be sent, oldest first.
 *
 * A client's publisher seals a full batch that its sender has not taken yet
 * (so a batch never grows past its limits while the sender is behind) and
 * keeps it here; the sender takes the oldest first, and puts one it could
 * not send back in front.  Plain C so that a native sender (fb_sender.h)
 * can take from it without Python.  Not thread-safe: its owner's lock
 * guards it (the publisher's outbox lock).
 */
#ifndef FB_BATCHQ_H
#define FB_BATCHQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_batchq_item {
    unsigned char *buf;          /* malloc'd (fb_free); the queue owns it while queued */
    size_t len;
    uint32_t count;              /* records in it */
    struct fb_batchq_item *next;
} fb_batchq_item;

typedef struct fb_batchq {
    fb_batchq_item *head, *tail;
    size_t batches;
    size_t bytes;                /* sum of len */
    size_t count;                /* sum of count */
} fb_batchq;

void fb_batchq_init(fb_batchq *q);
/* Frees every batch still queued. */
void fb_batchq_clear(fb_batchq *q);

/* Queue buf (taking it over) at the back, or in front (one that could not be
 * sent).  FB_ENOMEM: nothing changed, buf is still the caller's. */
int fb_batchq_push(fb_batchq *q, unsigned char *buf, size_t len, uint32_t count);
int fb_batchq_push_front(fb_batchq *q, unsigned char *buf, size_t len, uint32_t count);

/* The oldest batch without taking it (1), or 0 if empty: a sender that
 * sends a copy pops it only once the send succeeded. */
int fb_batchq_peek(const fb_batchq *q, unsigned char **buf, size_t *len, uint32_t *count);

/* The oldest batch, handed over (1), or 0 if empty. */
int fb_batchq_pop(fb_batchq *q, unsigned char **buf, size_t *len, uint32_t *count);

#ifdef __cplusplus
}
#endif
#endif /* FB_BATCHQ_H */
