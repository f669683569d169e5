/* fb_linkq.c - see fb_linkq.h. */
#include "fb_linkq.h"

#include "fb_common.h"

#include <stdlib.h>
#include <string.h>

fb_qentry *fb_qentry_new(const fb_zmq_msg_calls *z, int nframes)
{
    if (nframes < 0 || nframes > 255) return NULL;
    size_t n = sizeof(fb_qentry) + (size_t)(nframes > 1 ? nframes - 1 : 0) * sizeof(fb_zmq_msg);
    fb_qentry *e = calloc(1, n);
    if (!e) return NULL;
    e->nframes = (uint8_t)nframes;
    for (int i = 0; i < nframes; i++) z->init(&e->frames[i]);
    e->size = FB_Q_ENTRY_BYTES;
    return e;
}

void fb_qentry_free(const fb_zmq_msg_calls *z, fb_qentry *e)
{
    for (int i = 0; i < e->nframes; i++) z->close(&e->frames[i]);
    free(e);
}

int fb_qentry_frame(const fb_zmq_msg_calls *z, fb_qentry *e, int i, const void *data, size_t n)
{
    z->close(&e->frames[i]);
    if (z->init_size(&e->frames[i], n) < 0) {
        z->init(&e->frames[i]);
        return -1;
    }
    if (n) memcpy(z->data(&e->frames[i]), data, n);
    e->size += n;
    return 0;
}

/* Make an entry a mark (its frames go). */
static void make_mark(const fb_zmq_msg_calls *z, fb_qentry *e, uint8_t kind)
{
    for (int i = 0; i < e->nframes; i++) z->close(&e->frames[i]);
    e->nframes = 0;
    e->kind = kind;
    e->records = 0;
    e->size = FB_Q_ENTRY_BYTES;
}

static void free_batch(void *data, void *hint)
{
    (void)hint;
    fb_free(data);
}

int fb_qentry_own(const fb_zmq_msg_calls *z, fb_qentry *e, int i, unsigned char *buf, size_t n)
{
    fb_zmq_msg m;
    if (z->init_data(&m, buf, n, free_batch, NULL) < 0) return -1;
    z->close(&e->frames[i]);
    e->frames[i] = m;
    e->size += n;
    return 0;
}

void fb_linkq_push_front(fb_linkq *q, fb_qentry *e)
{
    e->next = q->head;
    q->head = e;
    if (!q->tail) q->tail = e;
    q->bytes += e->size;
}

void fb_linkq_push(fb_linkq *q, fb_qentry *e)
{
    e->next = NULL;
    if (q->tail) q->tail->next = e;
    else q->head = e;
    q->tail = e;
    q->bytes += e->size;
}

/* Unlink `e`, whose predecessor is `prev` (NULL: e is the head). */
static void unlink_entry(fb_linkq *q, fb_qentry *prev, fb_qentry *e)
{
    if (prev) prev->next = e->next;
    else q->head = e->next;
    if (q->tail == e) q->tail = prev;
    q->bytes -= e->size;
}

void fb_linkq_pop(const fb_zmq_msg_calls *z, fb_linkq *q)
{
    fb_qentry *e = q->head;
    unlink_entry(q, NULL, e);
    fb_qentry_free(z, e);
}

void fb_linkq_clear(const fb_zmq_msg_calls *z, fb_linkq *q)
{
    while (q->head) fb_linkq_pop(z, q);
    q->bytes = 0;
    q->lost = 0;
    q->marks = 0;
}

uint64_t fb_linkq_drop_data(const fb_zmq_msg_calls *z, fb_linkq *q, size_t limit)
{
    fb_qentry *e = q->head, *prev = NULL, *newest = NULL;
    uint64_t dropped = 0;
    for (fb_qentry *x = q->head; x; x = x->next)
        if (x->records) newest = x;
    while (e && q->bytes > limit) {
        fb_qentry *next = e->next;
        if (e->records && !e->done && e != newest) {
            unlink_entry(q, prev, e);
            dropped += e->records;
            fb_qentry_free(z, e);
        } else {
            prev = e;
        }
        e = next;
    }
    q->lost += dropped;
    return dropped;
}

int fb_linkq_collapse(const fb_zmq_msg_calls *z, fb_linkq *q, uint8_t cmd, uint8_t mark, uint8_t kind)
{
    if (q->marks & mark) return 1;
    fb_qentry *e = q->head, *prev = NULL;
    int placed = 0;
    while (e) {
        fb_qentry *next = e->next;
        if (e->kind == FB_Q_FRAMES && !e->records && e->cmd == cmd) {
            if (!placed) {
                q->bytes -= e->size;
                make_mark(z, e, kind);
                q->bytes += e->size;
                placed = 1;
                prev = e;
            } else {
                unlink_entry(q, prev, e);
                fb_qentry_free(z, e);
            }
        } else {
            prev = e;
        }
        e = next;
    }
    if (!placed) {
        e = fb_qentry_new(z, 0);
        if (!e) return 0;
        e->kind = kind;
        fb_linkq_push(q, e);
    }
    q->marks |= mark;
    return 1;
}
