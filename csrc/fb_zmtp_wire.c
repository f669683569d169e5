/* fb_zmtp_wire.c - see fb_zmtp_wire.h. */
#define _GNU_SOURCE
#include "fb_zmtp_wire.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

int fb_zbuf_reserve(fb_zbuf *b, size_t more)
{
    if (b->off && b->off == b->len) b->off = b->len = 0;
    if (b->cap - b->len >= more) return 0;
    if (b->off) {                                /* slide the live bytes down first */
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->cap - b->len >= more) return 0;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < more) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    unsigned char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int fb_zbuf_put(fb_zbuf *b, const void *data, size_t n)
{
    if (fb_zbuf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

int fb_zbuf_insert(fb_zbuf *b, size_t *at, const void *data, size_t n)
{
    size_t before = b->off;
    if (fb_zbuf_reserve(b, n) < 0) return -1;
    *at -= before - b->off;                      /* (the live bytes may have slid down) */
    memmove(b->p + *at + n, b->p + *at, b->len - *at);
    memcpy(b->p + *at, data, n);
    *at += n;
    b->len += n;
    return 0;
}

void fb_zbuf_free(fb_zbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

size_t fb_zmtp_frame_header(unsigned char *h, int flags, size_t len)
{
    if (len <= 255) {
        h[0] = (unsigned char)flags;
        h[1] = (unsigned char)len;
        return 2;
    }
    h[0] = (unsigned char)(flags | 2);
    for (int i = 0; i < 8; i++) h[1 + i] = (unsigned char)((uint64_t)len >> (56 - 8 * i));
    return 9;
}

int fb_zmtp_parse_header(const unsigned char *p, size_t avail, int *flags, size_t *hlen, uint64_t *size)
{
    if (avail < 1) return 0;
    int f = p[0];
    if (f & ~7) return -1;
    if ((f & 4) && (f & 1)) return -1;           /* a command has no "more" */
    if (f & 2) {
        if (avail < 9) return 0;
        uint64_t s = 0;
        for (int i = 0; i < 8; i++) s = (s << 8) | p[1 + i];
        *size = s;
        *hlen = 9;
    } else {
        if (avail < 2) return 0;
        *size = p[1];
        *hlen = 2;
    }
    *flags = f;
    return 1;
}

int fb_zmtp_next(const unsigned char *p, size_t len, int ready, uint64_t max_msg,
                 size_t *body, uint64_t *size, size_t *need)
{
    size_t pos = 0, hl;
    uint64_t total = 0, sz;
    int flags, rc;
    *need = 0;
    while ((rc = fb_zmtp_parse_header(p + pos, len - pos, &flags, &hl, &sz)) == 1) {
        int command = flags & 4;
        if (command ? pos != 0 || sz > FB_ZMTP_MAX_COMMAND         /* inside a message; too long */
                    : !ready || sz > max_msg || (total += sz) > max_msg) {
            return FB_ZMTP_BAD;
        }
        if (len - pos - hl < sz) {                   /* not all here */
            *need = (size_t)(sz - (len - pos - hl));
            return FB_ZMTP_PARTIAL;
        }
        if (command) {
            *body = hl;
            *size = sz;
            return FB_ZMTP_COMMAND;
        }
        pos += hl + (size_t)sz;
        if (!(flags & 1)) return FB_ZMTP_MESSAGE;
    }
    return rc < 0 ? FB_ZMTP_BAD : FB_ZMTP_PARTIAL;
}

size_t fb_zmtp_whole_end(const unsigned char *p, size_t len, int inside, uint64_t max_msg)
{
    size_t pos = 0, end = 0, hl;
    uint64_t size, total = 0;
    int flags;
    while (fb_zmtp_parse_header(p + pos, len - pos, &flags, &hl, &size) == 1 && size <= len - pos - hl) {
        if (flags & 4) {
            if (inside) break;
        } else if ((total += size) > max_msg) {
            break;
        }
        pos += hl + (size_t)size;
        inside = flags & 1;
        if (!inside) {
            end = pos;
            total = 0;
        }
    }
    return end;
}

size_t fb_zmtp_skip_commands(const unsigned char *p, size_t len)
{
    size_t pos = 0, hl;
    uint64_t size;
    int flags;
    while (pos < len && fb_zmtp_parse_header(p + pos, len - pos, &flags, &hl, &size) == 1 && (flags & 4)
           && size <= len - pos - hl)
        pos += hl + (size_t)size;
    return pos;
}

void fb_zmtp_greeting(unsigned char g[FB_ZMTP_GREETING], int as_server)
{
    memset(g, 0, FB_ZMTP_GREETING);
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 0;
    memcpy(g + 12, "NULL", 4);
    g[32] = as_server ? 1 : 0;
}

int fb_zmtp_greeting_ok(const unsigned char g[FB_ZMTP_GREETING])
{
    return g[0] == 0xFF && (g[9] & 1) && g[10] >= 3 && memcmp(g + 12, "NULL\0", 5) == 0;
}

int fb_zmtp_put_ready(fb_zbuf *b, const char *socket_type)
{
    static const char type_name[] = "Socket-Type";
    unsigned char cmd[64], h[9];
    size_t tl = strlen(socket_type), n = 0;
    if (tl > 16) return -1;
    cmd[n++] = 5;
    memcpy(cmd + n, "READY", 5);
    n += 5;
    cmd[n++] = (unsigned char)(sizeof type_name - 1);
    memcpy(cmd + n, type_name, sizeof type_name - 1);
    n += sizeof type_name - 1;
    cmd[n++] = 0; cmd[n++] = 0; cmd[n++] = 0;
    cmd[n++] = (unsigned char)tl;
    memcpy(cmd + n, socket_type, tl);
    n += tl;
    size_t hl = fb_zmtp_frame_header(h, 4, n);
    if (fb_zbuf_reserve(b, hl + n) < 0) return -1;
    fb_zbuf_put(b, h, hl);
    fb_zbuf_put(b, cmd, n);
    return 0;
}

int fb_zmtp_is_command(const unsigned char *body, uint64_t size, const char *name)
{
    size_t n = strlen(name);
    return size >= 1 + n && body[0] == n && memcmp(body + 1, name, n) == 0;
}

int fb_zmtp_ready_type(const unsigned char *p, uint64_t size, const unsigned char **type, size_t *len)
{
    size_t pos = 6;                              /* after "\x05READY" */
    while (pos < size) {
        size_t nl = p[pos++];
        if (nl > size - pos || size - pos - nl < 4) return 0;
        const unsigned char *name = p + pos;
        pos += nl;
        uint64_t vl = ((uint64_t)p[pos] << 24) | ((uint64_t)p[pos + 1] << 16) | ((uint64_t)p[pos + 2] << 8) | p[pos + 3];
        pos += 4;
        if (vl > size - pos) return 0;
        if (nl == 11 && strncasecmp((const char *)name, "Socket-Type", 11) == 0) {
            *type = p + pos;
            *len = (size_t)vl;
            return 1;
        }
        pos += (size_t)vl;
    }
    return 0;
}

size_t fb_zmtp_pong(unsigned char *f, const unsigned char *body, uint64_t size)
{
    if (!fb_zmtp_is_command(body, size, "PING") || size < 7) return 0;
    uint64_t ctx = size - 7 > 16 ? 16 : size - 7;   /* after the name and the 2-byte TTL */
    size_t n = fb_zmtp_frame_header(f, 4, 5 + (size_t)ctx);
    memcpy(f + n, "\x04PONG", 5);
    memcpy(f + n + 5, body + 7, (size_t)ctx);
    return n + 5 + (size_t)ctx;
}
