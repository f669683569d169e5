/*
 * fb_ring.h - what a resumable session was sent, kept for a resume.
 *
 * A broker keeps, per resumable session, the DATA batches (and GAPs) that
 * went to its connection, oldest first, each numbered by the session's
 * stream count (records delivered or announced lost, up to and including
 * it).  A cut connection loses what the kernel, or a forwarder, held for
 * it; the client says in its resuming HELLO how many it took ("taken"),
 * and what follows is sent again (docs/PROTOCOL.md, "Resuming a
 * session").  The ring is bounded in bytes: what falls off its old end is
 * remembered only as the count through it (`trimmed`), so a resume from
 * before it is told one GAP of the exact number.  The client's TAKEN
 * frees what it covers (fb_ring_trim).
 *
 * Why C: the broker's data plane (fastbus/broker/_relay.pyx) keeps and
 * replays these without the GIL, and a list with a byte bound and an exact
 * count of what it let go is easiest to trust with unit tests under
 * ASan/UBSan (tests/test_ring.c).  Not thread-safe: its owner's thread.
 */
#ifndef FB_RING_H
#define FB_RING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What one kept entry costs beyond its batch, counted against the bound. */
#define FB_RING_ENTRY_BYTES 64

typedef struct fb_ring_entry {
    struct fb_ring_entry *next;
    unsigned char *buf;          /* the batch (the core's allocation: fb_free), NULL for a GAP */
    size_t len;
    uint64_t records;            /* records in the batch, or the GAP's count */
    uint64_t end;                /* the stream's count through this entry */
    uint8_t seq[8];              /* the DATA frame's seq it went with */
} fb_ring_entry;

typedef struct fb_ring {
    fb_ring_entry *head;         /* oldest */
    fb_ring_entry *tail;
    size_t bytes;                /* batches' bytes + FB_RING_ENTRY_BYTES each */
    uint64_t trimmed;            /* the stream's count through the last entry let go */
} fb_ring;

/* Keep a batch (`buf`, which becomes the ring's; NULL: a GAP of `records`)
 * that the stream counted through `end`, then let the oldest entries go
 * while the ring holds more than `limit` bytes (the newest always stays).
 * Without memory for the entry, the batch is freed and the ring forgets
 * everything through `end` (fb_ring_forget): a resume from before it is
 * told the exact loss. */
void fb_ring_keep(fb_ring *r, unsigned char *buf, size_t len, uint64_t records, uint64_t end,
                  const uint8_t seq[8], size_t limit);

/* The client took everything through `taken`: let go what that covers. */
void fb_ring_trim(fb_ring *r, uint64_t taken);

/* Let go of every entry; `trimmed` becomes `end` (no memory to keep them,
 * a restored session's start): a resume from before it is one GAP. */
void fb_ring_forget(fb_ring *r, uint64_t end);

/* Empty, as new (trimmed 0). */
void fb_ring_clear(fb_ring *r);

/* Detach the oldest entry (NULL if none) and hand it to the caller, which
 * frees it with fb_ring_entry_free (a resume moves the batches out
 * without copying them: set e->buf NULL first to keep the batch).
 * `trimmed` does not change: the caller says where the stream restarts
 * (fb_ring_forget). */
fb_ring_entry *fb_ring_detach(fb_ring *r);

/* Free an entry fb_ring_detach handed out, and its batch if it still has
 * one. */
void fb_ring_entry_free(fb_ring_entry *e);

#ifdef __cplusplus
}
#endif
#endif /* FB_RING_H */
