/* fb_backlog.c - a held queue group's FIFO of kept records (see fb_backlog.h). */
#include "fb_backlog.h"

#include <stdlib.h>
#include <string.h>

void fb_backlog_init(fb_backlog *b)
{
    memset(b, 0, sizeof *b);
}

void fb_backlog_destroy(fb_backlog *b)
{
    fb_backlog_clear(b);
    free(b->items);
    memset(b, 0, sizeof *b);
}

/* Room for one more item: the ring doubles, unwrapped into the new one. */
static int grow(fb_backlog *b)
{
    if (b->count < b->cap) return FB_OK;
    size_t c = b->cap ? b->cap * 2 : 8;
    if (c > SIZE_MAX / sizeof(fb_backlog_item)) return FB_ENOMEM;
    fb_backlog_item *items = malloc(c * sizeof *items);
    if (!items) return FB_ENOMEM;
    for (size_t i = 0; i < b->count; i++) items[i] = b->items[(b->head + i) % b->cap];
    free(b->items);
    b->items = items;
    b->cap = c;
    b->head = 0;
    return FB_OK;
}

int fb_backlog_push(fb_backlog *b, const fb_record *rec, uint64_t at_ns)
{
    const unsigned char *headers = rec->headers;
    const uint32_t hlen = rec->headers_len;
    int rc = grow(b);
    if (rc < 0) return rc;
    size_t len = (size_t)rec->topic_len + hlen + rec->payload_len;
    unsigned char *data = malloc(len ? len : 1);
    if (!data) return FB_ENOMEM;
    unsigned char *p = data;
    if (rec->topic_len) memcpy(p, rec->topic, rec->topic_len);
    p += rec->topic_len;
    if (hlen) memcpy(p, headers, hlen);
    p += hlen;
    if (rec->payload_len) memcpy(p, rec->payload, rec->payload_len);
    fb_backlog_item *it = &b->items[(b->head + b->count) % b->cap];
    *it = (fb_backlog_item){ data, rec->topic_len, hlen, rec->payload_len, at_ns };
    b->count++;
    b->bytes += len + sizeof *it;
    return FB_OK;
}

int fb_backlog_at(const fb_backlog *b, size_t i, fb_record *rec, uint64_t *at_ns)
{
    if (i >= b->count) return 0;
    const fb_backlog_item *it = &b->items[(b->head + i) % b->cap];
    rec->topic = it->data;
    rec->topic_len = it->topic_len;
    rec->headers = it->headers_len ? it->data + it->topic_len : NULL;
    rec->headers_len = it->headers_len;
    rec->payload = it->data + it->topic_len + it->headers_len;
    rec->payload_len = it->payload_len;
    if (at_ns) *at_ns = it->at_ns;
    return 1;
}

void fb_backlog_pop(fb_backlog *b)
{
    if (!b->count) return;
    fb_backlog_item *it = &b->items[b->head];
    b->bytes -= (size_t)it->topic_len + it->headers_len + it->payload_len + sizeof *it;
    free(it->data);
    it->data = NULL;
    b->head = (b->head + 1) % b->cap;
    b->count--;
}

size_t fb_backlog_expire(fb_backlog *b, uint64_t before_ns)
{
    size_t n = 0;
    while (b->count && b->items[b->head].at_ns < before_ns) {
        fb_backlog_pop(b);
        n++;
    }
    return n;
}

size_t fb_backlog_clear(fb_backlog *b)
{
    size_t n = b->count;
    while (b->count) fb_backlog_pop(b);
    return n;
}
