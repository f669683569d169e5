/* fb_common.c - status strings, clock, id vectors and key lists. */
#define _POSIX_C_SOURCE 200809L
#include "fb_common.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *fb_strerror(int code)
{
    switch (code) {
    case FB_OK: return "ok";
    case FB_ENOMEM: return "out of memory";
    case FB_EINVAL: return "invalid argument";
    case FB_ENOTFOUND: return "not subscribed";
    case FB_ETOOBIG: return "too big";
    case FB_EOVERFLOW: return "reference count overflow";
    case FB_EMALFORMED: return "malformed batch";
    case FB_ETRUNCATED: return "truncated batch";
    case FB_EVERSION: return "unsupported batch version or flags";
    case FB_ELIMIT: return "batch field exceeds limit";
    case FB_ECHECKSUM: return "batch checksum mismatch";
    case FB_EIO: return "socket error";
    case FB_ECLOSED: return "connection closed by the peer";
    case FB_ETIMEOUT: return "timed out";
    default: return "unknown error";
    }
}

uint64_t fb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void fb_free(void *p) { free(p); }

/* Grow a capacity to hold at least `need` items: x1.5, at least 8.  Returns 0
 * when the byte size would overflow size_t. */
static size_t grow_cap(size_t cap, size_t need, size_t item)
{
    size_t c = cap < 8 ? 8 : cap + cap / 2;
    if (c < need) c = need;
    if (c > SIZE_MAX / item) return 0;
    return c;
}

void fb_idvec_init(fb_idvec *v) { v->ids = NULL; v->n = v->cap = 0; }
void fb_idvec_free(fb_idvec *v) { free(v->ids); fb_idvec_init(v); }

int fb_idvec_reserve(fb_idvec *v, size_t extra)
{
    if (extra > SIZE_MAX - v->n) return FB_ENOMEM;
    size_t need = v->n + extra;
    if (need <= v->cap) return FB_OK;
    size_t c = grow_cap(v->cap, need, sizeof(uint64_t));
    if (!c) return FB_ENOMEM;
    uint64_t *p = realloc(v->ids, c * sizeof(uint64_t));
    if (!p) return FB_ENOMEM;
    v->ids = p;
    v->cap = c;
    return FB_OK;
}

void fb_keylist_init(fb_keylist *l) { memset(l, 0, sizeof *l); }

void fb_keylist_free(fb_keylist *l)
{
    free(l->ents);
    free(l->bytes);
    fb_keylist_init(l);
}

void fb_keylist_clear(fb_keylist *l) { l->n = 0; l->nbytes = 0; }

int fb_keylist_push(fb_keylist *l, uint32_t flags, uint32_t count,
                    const void *key, size_t len)
{
    if (l->n == l->cap) {
        size_t c = grow_cap(l->cap, l->n + 1, sizeof(fb_keyent));
        if (!c) return FB_ENOMEM;
        fb_keyent *e = realloc(l->ents, c * sizeof(fb_keyent));
        if (!e) return FB_ENOMEM;
        l->ents = e;
        l->cap = c;
    }
    if (len > SIZE_MAX - l->nbytes) return FB_ENOMEM;
    if (l->nbytes + len > l->capbytes) {
        size_t c = grow_cap(l->capbytes, l->nbytes + len, 1);
        if (!c) return FB_ENOMEM;
        unsigned char *b = realloc(l->bytes, c);
        if (!b) return FB_ENOMEM;
        l->bytes = b;
        l->capbytes = c;
    }
    if (len) memcpy(l->bytes + l->nbytes, key, len);
    fb_keyent *e = &l->ents[l->n++];
    e->flags = flags;
    e->count = count;
    e->off = l->nbytes;
    e->len = len;
    l->nbytes += len;
    return FB_OK;
}

int fb_keylist_extend(fb_keylist *dst, const fb_keylist *src)
{
    for (size_t i = 0; i < src->n; i++) {
        const fb_keyent *e = &src->ents[i];
        int rc = fb_keylist_push(dst, e->flags, e->count, src->bytes + e->off, e->len);
        if (rc < 0) return rc;
    }
    return FB_OK;
}
