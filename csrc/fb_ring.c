/* fb_ring.c - see fb_ring.h. */
#include "fb_ring.h"

#include <stdlib.h>
#include <string.h>

#include "fb_common.h"

void fb_ring_entry_free(fb_ring_entry *e)
{
    if (e->buf) fb_free(e->buf);
    free(e);
}

fb_ring_entry *fb_ring_detach(fb_ring *r)
{
    fb_ring_entry *e = r->head;
    if (!e) return NULL;
    r->head = e->next;
    if (!r->head) r->tail = NULL;
    r->bytes -= e->len + FB_RING_ENTRY_BYTES;
    e->next = NULL;
    return e;
}

/* Let the oldest entry go, remembering the count through it. */
static void pop(fb_ring *r)
{
    fb_ring_entry *e = fb_ring_detach(r);
    r->trimmed = e->end;
    fb_ring_entry_free(e);
}

void fb_ring_clear(fb_ring *r)
{
    while (r->head) pop(r);
    r->bytes = 0;
    r->trimmed = 0;
}

void fb_ring_forget(fb_ring *r, uint64_t end)
{
    fb_ring_clear(r);
    r->trimmed = end;
}

void fb_ring_keep(fb_ring *r, unsigned char *buf, size_t len, uint64_t records, uint64_t end,
                  const uint8_t seq[8], size_t limit)
{
    fb_ring_entry *e = malloc(sizeof *e);
    if (!e) {
        if (buf) fb_free(buf);
        fb_ring_forget(r, end);
        return;
    }
    e->next = NULL;
    e->buf = buf;
    e->len = buf ? len : 0;
    e->records = records;
    e->end = end;
    memcpy(e->seq, seq, 8);
    if (r->tail) r->tail->next = e;
    else r->head = e;
    r->tail = e;
    r->bytes += e->len + FB_RING_ENTRY_BYTES;
    while (r->bytes > limit && r->head != e) pop(r);
}

void fb_ring_trim(fb_ring *r, uint64_t taken)
{
    while (r->head && r->head->end <= taken) pop(r);
}
