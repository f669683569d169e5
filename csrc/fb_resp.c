/* fb_resp.c - scanning pipelined Redis replies (see fb_resp.h). */
#include "fb_resp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifndef _WIN32
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#endif

enum { NEED_MORE = 1 };

/* The line at p (up to CRLF) within end: sets *eol to the '\r'.
 * NEED_MORE if no CRLF yet, FB_EMALFORMED for a lone '\r'. */
static int find_line(const unsigned char *p, const unsigned char *end, const unsigned char **eol)
{
    const unsigned char *r = memchr(p, '\r', (size_t)(end - p));
    if (!r || r + 1 >= end) return NEED_MORE;
    if (r[1] != '\n') return FB_EMALFORMED;
    *eol = r;
    return FB_OK;
}

/* A signed decimal filling [p, eol) exactly, at most 19 digits. */
static int parse_int(const unsigned char *p, const unsigned char *eol, int64_t *out)
{
    int neg = 0;
    if (p < eol && (*p == '-' || *p == '+')) neg = *p++ == '-';
    size_t n = (size_t)(eol - p);
    if (n == 0 || n > 19) return FB_EMALFORMED;
    uint64_t v = 0;
    for (; p < eol; p++) {
        if (*p < '0' || *p > '9') return FB_EMALFORMED;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v > (uint64_t)INT64_MAX) return FB_EMALFORMED;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return FB_OK;
}

int fb_resp_scan(const void *buf, size_t len, size_t max_replies, fb_resp_tally *t,
                 uint32_t *err_idx, size_t err_cap)
{
    memset(t, 0, sizeof *t);
    if (!buf && len) return FB_EINVAL;
    const unsigned char *base = buf, *end = base + len, *p = base;
    while (t->replies < max_replies && p < end) {
        /* One top-level reply: `pending` counts the elements still to skip
         * (an aggregate adds its children), so nesting needs no stack.
         * RESP3 attributes ('|') are not accepted: a RESP2 connection never
         * gets them. */
        const unsigned char *q = p;
        uint64_t pending = 1;
        int top = 1, is_err = 0;
        int64_t ival = 0;
        size_t eoff = 0, elen = 0;
        while (pending) {
            if (q >= end) return FB_OK;                      /* incomplete */
            unsigned char type = *q;
            const unsigned char *eol;
            int rc = find_line(q + 1, end, &eol);
            if (rc == NEED_MORE) return FB_OK;
            if (rc < 0) return rc;
            const unsigned char *body = q + 1;
            int64_t n;
            pending--;
            switch (type) {
            case '+': case '_': case ',': case '#': case '(':
                if (type == '_' && eol != body) return FB_EMALFORMED;
                q = eol + 2;
                break;
            case '-':
                if (top) {
                    is_err = 1;
                    eoff = (size_t)(body - base);
                    elen = (size_t)(eol - body);
                }
                q = eol + 2;
                break;
            case ':':
                if (parse_int(body, eol, &n) < 0) return FB_EMALFORMED;
                if (top) ival = n;
                q = eol + 2;
                break;
            case '$': case '=': case '!':                    /* bulk string, verbatim, bulk error */
                if (parse_int(body, eol, &n) < 0) return FB_EMALFORMED;
                if (n == -1 && type == '$') {                /* RESP2 null */
                    q = eol + 2;
                    break;
                }
                if (n < 0 || (uint64_t)n > FB_RESP_MAX_BULK) return FB_EMALFORMED;
                q = eol + 2;
                if ((size_t)(end - q) < (size_t)n + 2) return FB_OK;   /* incomplete */
                if (q[n] != '\r' || q[n + 1] != '\n') return FB_EMALFORMED;
                if (type == '!' && top) {
                    is_err = 1;
                    eoff = (size_t)(q - base);
                    elen = (size_t)n;
                }
                q += n + 2;
                break;
            case '*': case '~': case '>': case '%':
                if (parse_int(body, eol, &n) < 0) return FB_EMALFORMED;
                q = eol + 2;
                if (n == -1 && type == '*') break;           /* RESP2 null array */
                if (n < 0 || n > (int64_t)UINT32_MAX) return FB_EMALFORMED;
                pending += (uint64_t)n * (type == '%' ? 2u : 1u);
                break;
            default:
                return FB_EMALFORMED;
            }
            top = 0;
        }
        /* The whole reply is in: account for it. */
        if (is_err) {
            if (err_idx && t->errors < err_cap) err_idx[t->errors] = (uint32_t)t->replies;
            if (t->errors == 0) {
                t->first_err_off = eoff;
                t->first_err_len = elen;
            }
            t->errors++;
        }
        if (ival > 0 && t->int_sum > INT64_MAX - ival) t->int_sum = INT64_MAX;
        else if (ival < 0 && t->int_sum < INT64_MIN - ival) t->int_sum = INT64_MIN;
        else t->int_sum += ival;
        t->replies++;
        p = q;
        t->consumed = (size_t)(p - base);
    }
    return FB_OK;
}

static uint16_t crc16_xmodem(const unsigned char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

unsigned fb_resp_key_slot(const void *key, size_t len)
{
    const unsigned char *k = key;
    if (!k) len = 0;
    const unsigned char *open = len ? memchr(k, '{', len) : NULL;
    if (open) {
        const unsigned char *close = memchr(open + 1, '}', len - (size_t)(open + 1 - k));
        if (close && close > open + 1) {
            k = open + 1;
            len = (size_t)(close - k);
        }
    }
    return crc16_xmodem(k, len) & 16383u;
}

int fb_resp_flat_array(const void *buf, size_t len, fb_resp_elem *el, size_t max_elems, size_t *consumed)
{
    const unsigned char *base = buf, *end = base + len, *eol;
    *consumed = 0;
    if (len == 0) return 0;
    if (!buf || !el) return FB_EINVAL;
    if (base[0] != '*' && base[0] != '>') return FB_EMALFORMED;
    int rc = find_line(base + 1, end, &eol);
    if (rc == NEED_MORE) return 0;
    if (rc < 0) return rc;
    int64_t n;
    if (parse_int(base + 1, eol, &n) < 0 || n < 1 || (uint64_t)n > max_elems) return FB_EMALFORMED;
    const unsigned char *q = eol + 2;
    for (int64_t i = 0; i < n; i++) {
        if (q >= end) return 0;
        unsigned char type = *q;
        rc = find_line(q + 1, end, &eol);
        if (rc == NEED_MORE) return 0;
        if (rc < 0) return rc;
        int64_t v;
        if (parse_int(q + 1, eol, &v) < 0) return FB_EMALFORMED;
        if (type == ':') {
            el[i].ptr = q + 1;
            el[i].len = (size_t)(eol - q - 1);
            el[i].is_int = 1;
            q = eol + 2;
        } else if (type == '$') {
            q = eol + 2;
            el[i].is_int = 0;
            if (v == -1) {
                el[i].ptr = NULL;
                el[i].len = 0;
                continue;
            }
            if (v < 0 || (uint64_t)v > FB_RESP_MAX_BULK) return FB_EMALFORMED;
            if ((size_t)(end - q) < (size_t)v + 2) return 0;
            if (q[v] != '\r' || q[v + 1] != '\n') return FB_EMALFORMED;
            el[i].ptr = q;
            el[i].len = (size_t)v;
            q += v + 2;
        } else {
            return FB_EMALFORMED;
        }
    }
    *consumed = (size_t)(q - base);
    return (int)n;
}

void fb_resp_reader_init(fb_resp_reader *rd)
{
    memset(rd, 0, sizeof *rd);
}

void fb_resp_reader_destroy(fb_resp_reader *rd)
{
    free(rd->buf);
    memset(rd, 0, sizeof *rd);
}

void fb_resp_reader_reset(fb_resp_reader *rd)
{
    rd->len = 0;
    rd->first_err_len = 0;
}

#ifdef _WIN32
int fb_resp_pump(int fd, const void *data, size_t len, size_t need, int timeout_ms,
                 fb_resp_reader *rd, fb_resp_tally *t, uint32_t *err_idx, size_t err_cap)
{
    (void)fd; (void)data; (void)len; (void)need; (void)timeout_ms; (void)rd; (void)err_idx; (void)err_cap;
    memset(t, 0, sizeof *t);
    return FB_EINVAL;
}
#else

/* A send to a peer that closed must fail with EPIPE, not raise SIGPIPE: a
 * C program embedding the core may not ignore that signal as Python does.
 * Linux has a per-call flag; macOS and the BSDs a per-socket option, set
 * in fb_resp_pump. */
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#define FB_SET_NOSIGPIPE 1
#endif

#define READ_CHUNK 65536u

/* Consume complete replies from rd, at most need - t->replies. */
static int consume(fb_resp_reader *rd, size_t need, fb_resp_tally *t, uint32_t *err_idx, size_t err_cap)
{
    if (t->replies >= need || rd->len == 0) return FB_OK;
    fb_resp_tally s;
    size_t have_idx = t->errors < err_cap ? t->errors : err_cap;
    int rc = fb_resp_scan(rd->buf, rd->len, need - t->replies, &s,
                          err_idx ? err_idx + have_idx : NULL, err_cap - have_idx);
    size_t wrote = s.errors < err_cap - have_idx ? s.errors : err_cap - have_idx;
    for (size_t k = 0; err_idx && k < wrote; k++) err_idx[have_idx + k] += (uint32_t)t->replies;
    if (s.errors && rd->first_err_len == 0) {
        size_t n = s.first_err_len < sizeof rd->first_err - 1 ? s.first_err_len : sizeof rd->first_err - 1;
        memcpy(rd->first_err, rd->buf + s.first_err_off, n);
        rd->first_err[n] = 0;
        rd->first_err_len = n ? n : 1;
    }
    t->replies += s.replies;
    t->errors += s.errors;
    t->int_sum += s.int_sum;
    t->consumed += s.consumed;
    memmove(rd->buf, rd->buf + s.consumed, rd->len - s.consumed);
    rd->len -= s.consumed;
    return rc;
}

int fb_resp_pump(int fd, const void *data, size_t len, size_t need, int timeout_ms,
                 fb_resp_reader *rd, fb_resp_tally *t, uint32_t *err_idx, size_t err_cap)
{
    memset(t, 0, sizeof *t);
    rd->first_err_len = 0;
    if (fd < 0 || (len && !data)) return FB_EINVAL;
    const unsigned char *p = data;
    size_t left = len;
#if defined(FB_SET_NOSIGPIPE) && defined(SO_NOSIGPIPE)
    if (left) {
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
    }
#endif
    for (;;) {
        int rc = consume(rd, need, t, err_idx, err_cap);
        if (rc < 0) return rc;
        if (left == 0 && t->replies >= need) return FB_OK;
        struct pollfd pfd = { fd, (short)(POLLIN | (left ? POLLOUT : 0)), 0 };
        int pr = poll(&pfd, 1, timeout_ms);
        if (pr < 0) {
            if (errno == EINTR) continue;
            return FB_EIO;
        }
        if (pr == 0) return FB_ETIMEOUT;
        if (left && (pfd.revents & POLLOUT)) {
            ssize_t n = send(fd, p, left, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n > 0) {
                p += n;
                left -= (size_t)n;
            } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return errno == EPIPE || errno == ECONNRESET ? FB_ECLOSED : FB_EIO;
            }
        }
        if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
            /* Replies may run ahead of `need` (they belong to later
             * batches): they are kept, and the buffer grows for them. */
            if (rd->cap - rd->len < READ_CHUNK) {
                size_t cap = rd->cap ? rd->cap * 2 : READ_CHUNK * 2;
                while (cap - rd->len < READ_CHUNK) cap *= 2;
                unsigned char *b = realloc(rd->buf, cap);
                if (!b) return FB_ENOMEM;
                rd->buf = b;
                rd->cap = cap;
            }
            ssize_t n = recv(fd, rd->buf + rd->len, rd->cap - rd->len, MSG_DONTWAIT);
            if (n == 0) return FB_ECLOSED;
            if (n > 0) {
                rd->len += (size_t)n;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return errno == ECONNRESET ? FB_ECLOSED : FB_EIO;
            }
        }
    }
}
#endif
