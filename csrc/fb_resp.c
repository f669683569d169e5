/* fb_resp.c - scanning pipelined Redis replies (see fb_resp.h). */
#include "fb_resp.h"

#include <string.h>

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
