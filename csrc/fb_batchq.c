/* fb_batchq.c - see fb_batchq.h. */
#include "fb_batchq.h"

#include <stdlib.h>

#include "fb_common.h"

void fb_batchq_init(fb_batchq *q)
{
    q->head = q->tail = NULL;
    q->batches = q->bytes = q->count = 0;
}

void fb_batchq_clear(fb_batchq *q)
{
    fb_batchq_item *it = q->head;
    while (it) {
        fb_batchq_item *next = it->next;
        free(it->buf);
        free(it);
        it = next;
    }
    fb_batchq_init(q);
}

static fb_batchq_item *item(unsigned char *buf, size_t len, uint32_t count)
{
    fb_batchq_item *it = malloc(sizeof *it);
    if (!it) return NULL;
    it->buf = buf;
    it->len = len;
    it->count = count;
    it->next = NULL;
    return it;
}

static void counted(fb_batchq *q, const fb_batchq_item *it)
{
    q->batches++;
    q->bytes += it->len;
    q->count += it->count;
}

int fb_batchq_push(fb_batchq *q, unsigned char *buf, size_t len, uint32_t count)
{
    fb_batchq_item *it = item(buf, len, count);
    if (!it) return FB_ENOMEM;
    if (q->tail) q->tail->next = it;
    else q->head = it;
    q->tail = it;
    counted(q, it);
    return FB_OK;
}

int fb_batchq_push_front(fb_batchq *q, unsigned char *buf, size_t len, uint32_t count)
{
    fb_batchq_item *it = item(buf, len, count);
    if (!it) return FB_ENOMEM;
    it->next = q->head;
    q->head = it;
    if (!q->tail) q->tail = it;
    counted(q, it);
    return FB_OK;
}

int fb_batchq_peek(const fb_batchq *q, unsigned char **buf, size_t *len, uint32_t *count)
{
    if (!q->head) return 0;
    *buf = q->head->buf;
    *len = q->head->len;
    *count = q->head->count;
    return 1;
}

int fb_batchq_pop(fb_batchq *q, unsigned char **buf, size_t *len, uint32_t *count)
{
    fb_batchq_item *it = q->head;
    if (!it) return 0;
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    q->batches--;
    q->bytes -= it->len;
    q->count -= it->count;
    *buf = it->buf;
    *len = it->len;
    *count = it->count;
    free(it);
    return 1;
}
