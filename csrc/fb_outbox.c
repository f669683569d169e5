/* fb_outbox.c - batch buffers with a flush policy (see fb_outbox.h). */
#include "fb_outbox.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_CAP 256u
#define MAX_HINT 65536u

void fb_outbox_init(fb_outbox *o, const fb_outbox_limits *lim)
{
    memset(o, 0, sizeof *o);
    if (lim) o->lim = *lim;
    o->cap_hint = MIN_CAP;
}

void fb_outbox_destroy(fb_outbox *o)
{
    free(o->buf);
    o->buf = NULL;
    o->len = o->cap = 0;
    o->count = 0;
}

static int reserve(fb_outbox *o, size_t extra)
{
    if (extra > SIZE_MAX - o->len) return FB_ETOOBIG;
    size_t need = o->len + extra;
    if (need <= o->cap) return FB_OK;
    size_t c = o->cap ? o->cap : o->cap_hint;
    while (c < need) c = c > SIZE_MAX / 2 ? need : c * 2;
    unsigned char *b = realloc(o->buf, c);
    if (!b) return FB_ENOMEM;
    o->buf = b;
    o->cap = c;
    return FB_OK;
}

static inline int due_now(const fb_outbox *o)
{
    return (o->lim.max_messages && o->count >= o->lim.max_messages) ||
           (o->lim.max_bytes && fb_outbox_bytes(o) >= o->lim.max_bytes);
}

int fb_outbox_init_resp(fb_outbox *o, const fb_outbox_limits *lim, const char *verb)
{
    fb_outbox_init(o, lim);
    size_t n = verb ? strlen(verb) : 0;
    if (n == 0 || n > FB_OUTBOX_VERB_MAX) return FB_EINVAL;
    for (size_t i = 0; i < n; i++) {
        char c = verb[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok) return FB_EINVAL;
    }
    int k = snprintf((char *)o->resp, sizeof o->resp, "*3\r\n$%u\r\n%s\r\n", (unsigned)n, verb);
    o->resp_len = (uint8_t)k;
    o->lim.checksum = 0;
    return FB_OK;
}

/* Decimal digits of v, written at p; returns their count. */
static size_t put_dec(unsigned char *p, size_t v)
{
    unsigned char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (unsigned char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++) p[i] = tmp[n - 1 - i];
    return n;
}

/* "$<len>\r\n<bytes>\r\n" */
static unsigned char *put_bulk(unsigned char *p, const void *s, size_t n)
{
    *p++ = '$';
    p += put_dec(p, n);
    *p++ = '\r';
    *p++ = '\n';
    if (n) memcpy(p, s, n);
    p += n;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static int append_resp(fb_outbox *o, const void *topic, size_t tlen,
                       const void *payload, size_t plen, uint64_t now_ns)
{
    /* Redis refuses bulk strings over 512 MB; so do we, before the network. */
    if (tlen > 512u * 1024 * 1024 || plen > 512u * 1024 * 1024 || o->count == UINT32_MAX) return FB_ETOOBIG;
    size_t need = o->resp_len + 2 * (1 + 20 + 2 + 2) + tlen + plen;
    int rc = reserve(o, need);
    if (rc < 0) return rc;
    if (o->count == 0) o->first_ns = now_ns;
    unsigned char *p = o->buf + o->len;
    memcpy(p, o->resp, o->resp_len);
    p += o->resp_len;
    p = put_bulk(p, topic, tlen);
    p = put_bulk(p, payload, plen);
    o->len = (size_t)(p - o->buf);
    o->count++;
    return due_now(o);
}

/* The pending batch becomes a headers batch: each record gains an empty
 * header block (one 0 byte after its two lengths).  Done in place, from
 * the last record back, after growing the buffer by the record count. */
static int add_headers_flag(fb_outbox *o)
{
    int rc = reserve(o, o->count);
    if (rc < 0) return rc;
    /* Where each record starts, walking forward (the outbox wrote them: no
     * checks needed), then moved back to front so nothing is overwritten
     * before it moved. */
    size_t n = o->count;
    size_t *starts = malloc(n * sizeof *starts);
    if (!starts) return FB_ENOMEM;
    size_t at = FB_BATCH_HEADER;
    for (size_t i = 0; i < n; i++) {
        starts[i] = at;
        const unsigned char *p = o->buf + at;
        uint32_t v[2];
        for (int k = 0; k < 2; k++) {
            uint32_t x = 0;
            unsigned sh = 0;
            for (;;) {
                unsigned b = *p++;
                x |= (uint32_t)(b & 0x7f) << sh;
                if (!(b & 0x80)) break;
                sh += 7;
            }
            v[k] = x;
        }
        at = (size_t)(p - o->buf) + v[0] + v[1];
    }
    size_t end = o->len;
    for (size_t i = n; i-- > 0;) {
        size_t s = starts[i];
        const unsigned char *p = o->buf + s;
        while (*p++ & 0x80) {}
        while (*p++ & 0x80) {}
        size_t lens = (size_t)(p - (o->buf + s)), body = end - s - lens;
        /* Record i moves by i bytes (the blocks of records 0..i-1), and
         * its own block goes between its lengths and its bytes. */
        memmove(o->buf + s + i + lens + 1, o->buf + s + lens, body);
        o->buf[s + i + lens] = 0;
        memmove(o->buf + s + i, o->buf + s, lens);
        end = s;
    }
    free(starts);
    o->len += n;
    o->buf[3] |= FB_BATCH_F_HEADERS;
    return FB_OK;
}

int fb_outbox_append(fb_outbox *o, const void *topic, size_t tlen,
                     const void *payload, size_t plen, uint64_t now_ns)
{
    return fb_outbox_append_h(o, topic, tlen, NULL, 0, payload, plen, now_ns);
}

int fb_outbox_append_h(fb_outbox *o, const void *topic, size_t tlen, const void *headers, size_t hlen,
                       const void *payload, size_t plen, uint64_t now_ns)
{
    if ((tlen && !topic) || (plen && !payload) || (hlen && !headers)) return FB_EINVAL;
    if (o->resp_len) return append_resp(o, topic, tlen, payload, plen, now_ns);
    if (tlen > UINT32_MAX || plen > UINT32_MAX || hlen > UINT32_MAX || o->count == UINT32_MAX) return FB_ETOOBIG;
    int flagged = o->count ? (o->buf[3] & FB_BATCH_F_HEADERS) != 0 : hlen > 0;
    if (hlen && !flagged) {
        int rc = add_headers_flag(o);
        if (rc < 0) return rc;
        flagged = 1;
    }
    /* A repeat: the record before (in this batch) has this very block.
     * (count: a batch taken, untaken or cleared starts again without.) */
    int repeat = o->again && hlen && o->count && hlen == o->last_hl && hlen <= FB_HEADERS_AGAIN_MAX &&
                 memcmp(o->buf + o->last_h, headers, hlen) == 0;
    size_t wire_hl = repeat ? 0 : hlen;
    size_t rec = fb_varint_len((uint32_t)tlen) + fb_varint_len((uint32_t)plen) +
                 (flagged ? fb_varint_len(repeat ? FB_HEADERS_AGAIN_LEN : (uint32_t)hlen) : 0);
    if (tlen + plen > SIZE_MAX - hlen - rec - FB_BATCH_HEADER - 4) return FB_ETOOBIG;
    rec += tlen + wire_hl + plen;
    int rc = reserve(o, rec + (o->count ? 0 : FB_BATCH_HEADER));
    if (rc < 0) return rc;
    if (o->count == 0) {
        unsigned char *h = o->buf;
        h[0] = FB_BATCH_MAGIC0;
        h[1] = FB_BATCH_MAGIC1;
        h[2] = FB_BATCH_VERSION;
        h[3] = (o->lim.checksum ? FB_BATCH_F_CRC32C : 0) | (flagged ? FB_BATCH_F_HEADERS : 0);
        memset(h + 4, 0, 4);          /* count, written at take */
        o->len = FB_BATCH_HEADER;
        o->first_ns = now_ns;
    }
    unsigned char *p = o->buf + o->len;
    p += fb_put_varint(p, (uint32_t)tlen);
    p += fb_put_varint(p, (uint32_t)plen);
    if (flagged) p += fb_put_varint(p, repeat ? FB_HEADERS_AGAIN_LEN : (uint32_t)hlen);
    if (tlen) memcpy(p, topic, tlen);
    p += tlen;
    if (repeat) {
        o->buf[3] |= FB_BATCH_F_HEADERS_AGAIN;
    } else {
        if (hlen) memcpy(p, headers, hlen);
        o->last_h = (size_t)(p - o->buf);
        o->last_hl = (uint32_t)hlen;
        p += hlen;
    }
    if (plen) memcpy(p, payload, plen);
    p += plen;
    o->len = (size_t)(p - o->buf);
    o->count++;
    return due_now(o);
}

void fb_outbox_set_again(fb_outbox *o, int on)
{
    o->again = on != 0;
}

int fb_outbox_full(const fb_outbox *o)
{
    return o->count && due_now(o);
}

int fb_outbox_due(const fb_outbox *o, uint64_t now_ns)
{
    if (o->count == 0) return 0;
    if (due_now(o)) return 1;
    return o->lim.max_age_ns && now_ns >= o->first_ns && now_ns - o->first_ns >= o->lim.max_age_ns;
}

uint64_t fb_outbox_deadline(const fb_outbox *o)
{
    if (o->count == 0 || !o->lim.max_age_ns) return UINT64_MAX;
    if (o->first_ns > UINT64_MAX - o->lim.max_age_ns) return UINT64_MAX;
    return o->first_ns + o->lim.max_age_ns;
}

int fb_outbox_take(fb_outbox *o, unsigned char **buf, size_t *len)
{
    if (o->count == 0) {
        *buf = NULL;
        *len = 0;
        return FB_OK;
    }
    if (!o->resp_len) {     /* batch format: count and checksum (a RESP pipeline has neither) */
        unsigned char *h = o->buf;
        h[4] = (unsigned char)o->count;
        h[5] = (unsigned char)(o->count >> 8);
        h[6] = (unsigned char)(o->count >> 16);
        h[7] = (unsigned char)(o->count >> 24);
        if (o->lim.checksum) {
            int rc = reserve(o, 4);
            if (rc < 0) return rc;
            uint32_t c = fb_crc32c(0, o->buf, o->len);
            unsigned char *t = o->buf + o->len;
            t[0] = (unsigned char)c;
            t[1] = (unsigned char)(c >> 8);
            t[2] = (unsigned char)(c >> 16);
            t[3] = (unsigned char)(c >> 24);
            o->len += 4;
        }
    }
    *buf = o->buf;
    *len = o->len;
    /* The next batch starts at the size this one reached, so a steady stream
     * allocates once per batch and never regrows; capped so that one huge
     * record does not make every later batch of this destination huge. */
    size_t limit = o->lim.max_bytes ? o->lim.max_bytes : MAX_HINT;
    size_t hint = o->len < limit ? o->len : limit;
    o->cap_hint = hint < MIN_CAP ? MIN_CAP : hint;
    o->buf = NULL;
    o->len = o->cap = 0;
    o->count = 0;
    return FB_OK;
}

int fb_outbox_untake(fb_outbox *o, unsigned char *buf, size_t len, uint32_t count)
{
    if (o->count || o->buf || !buf || !count) return FB_EINVAL;
    if (!o->resp_len && o->lim.checksum) {
        if (len < 4) return FB_EINVAL;
        len -= 4;               /* take appended the trailer; the next take does again */
    }
    o->buf = buf;
    o->len = o->cap = len;
    o->count = count;           /* first_ns is still the batch's: take leaves it */
    return FB_OK;
}

void fb_outbox_clear(fb_outbox *o)
{
    free(o->buf);
    o->buf = NULL;
    o->len = o->cap = 0;
    o->count = 0;
}
