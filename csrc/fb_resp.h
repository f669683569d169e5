/*
 * fb_resp.h - reading the replies to a Redis pipeline, many per call.
 *
 * A buffered publisher writes thousands of commands at once (fb_outbox in
 * RESP mode builds them) and must then read as many replies.  Parsing each
 * reply into an object only to count it, and to spot the rare error, is
 * most of the client's cost; fb_resp_scan walks the raw bytes instead,
 * counting complete top-level replies, summing integer replies (PUBLISH:
 * how many subscribers got the message) and noting which were errors.
 *
 * Input is untrusted network data: every length is bounded and checked
 * against the buffer, nothing recurses (nested aggregates are skipped with
 * a counter), and a reply cut at the end of the buffer is left for the next
 * call.  RESP2 and the RESP3 types are understood.
 */
#ifndef FB_RESP_H
#define FB_RESP_H

#include "fb_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Redis's own limits: a bulk string is at most 512 MB; aggregates here may
 * declare at most 2^32 elements. */
#define FB_RESP_MAX_BULK (512u * 1024u * 1024u)

typedef struct fb_resp_tally {
    size_t replies;        /* complete top-level replies consumed */
    size_t errors;         /* of which error replies ("-..." or "!...") */
    int64_t int_sum;       /* sum of top-level integer replies (saturating) */
    size_t consumed;       /* bytes those replies took */
    size_t first_err_off;  /* the first error's message: offset in buf ... */
    size_t first_err_len;  /* ... and length (without the type byte and CRLF); 0 if none */
} fb_resp_tally;

/* Scan at most max_replies complete replies from buf[0, len).  The index
 * (from 0, in this call) of each error reply is stored in err_idx while
 * err_cap allows (err_idx may be NULL).  Returns FB_OK, with t filled in
 * (an incomplete reply at the end is not consumed), or FB_EMALFORMED if the
 * bytes are not RESP: the connection is then unusable.  t->replies and
 * t->consumed then cover the replies before the bad one. */
int fb_resp_scan(const void *buf, size_t len, size_t max_replies, fb_resp_tally *t,
                 uint32_t *err_idx, size_t err_cap);

/* The Redis Cluster hash slot of a key (0..16383): CRC16 (XMODEM) of the
 * key, or of the part between the first '{' and the next '}' if that part
 * is not empty (a hash tag), modulo 16384. */
unsigned fb_resp_key_slot(const void *key, size_t len);

/* One element of a flat array: a bulk string, or an integer's digits. */
typedef struct fb_resp_elem {
    const unsigned char *ptr;
    size_t len;
    int is_int;             /* 1 for ":<n>", 0 for "$<n>" (a null bulk has ptr NULL) */
} fb_resp_elem;

/* The first reply in buf, if it is a flat array of at most max_elems bulk
 * strings or integers: a pub/sub push message such as
 * ["message", channel, data] or ["pmessage", pattern, channel, data].
 * Returns its element count and sets *consumed to its size; returns 0
 * with *consumed = 0 if the reply is incomplete; FB_EMALFORMED if it is
 * not such an array (or not RESP). */
int fb_resp_flat_array(const void *buf, size_t len, fb_resp_elem *el, size_t max_elems, size_t *consumed);

/*
 * Streaming a pipeline over a socket (POSIX).  A buffered publisher in an
 * interpreter with a global lock (CPython's GIL) must not need that lock
 * for every partial send and receive: another thread holding it delays
 * each by up to its switch interval, and the server idles meanwhile.
 * fb_resp_pump does one step of the pipeline in C: it writes `data` while
 * reading replies, and returns once all of `data` is written and `need`
 * more replies are consumed.  Replies beyond `need` stay in the reader
 * for the next call, so the caller can keep one batch in flight while it
 * prepares the next.
 */
typedef struct fb_resp_reader {
    unsigned char *buf;    /* received bytes not consumed yet */
    size_t len, cap;
    char first_err[256];   /* the first error reply of the last pump call */
    size_t first_err_len;  /* (truncated to 255 bytes); 0 if none */
} fb_resp_reader;

void fb_resp_reader_init(fb_resp_reader *rd);
void fb_resp_reader_destroy(fb_resp_reader *rd);
/* Forget buffered bytes (after a reconnect). */
void fb_resp_reader_reset(fb_resp_reader *rd);

/* fd: a connected stream socket; it is used non-blocking (MSG_DONTWAIT)
 * with poll() and timeout_ms per wait (-1: none).  t counts the replies
 * consumed by this call (at most `need`) and err_idx gets the indexes of
 * error replies among them, as fb_resp_scan.  Returns FB_OK, FB_ETIMEOUT,
 * FB_ECLOSED, FB_EIO (errno is kept), FB_ENOMEM or FB_EMALFORMED; on an
 * error, t still counts the replies consumed before it.  Not on Windows
 * (FB_EINVAL there). */
int fb_resp_pump(int fd, const void *data, size_t len, size_t need, int timeout_ms,
                 fb_resp_reader *rd, fb_resp_tally *t, uint32_t *err_idx, size_t err_cap);

#ifdef __cplusplus
}
#endif

#endif /* FB_RESP_H */
