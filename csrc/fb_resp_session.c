/* fb_resp_session.c - see fb_resp_session.h.
 *
 * Three parts: the request parser (incremental, bounded), the keys this
 * connection subscribed (two small hash sets: channels, with a flag for
 * shard channels, and patterns), and the two translations (requests to
 * fastbus messages, the broker's messages to replies and pushes).
 *
 * (Over 700 lines because the three parts share one connection's state and
 * must agree on it: splitting them would export that state.)
 */
#include "fb_resp_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fb_batch.h"
#include "fb_common.h"
#include "fb_glob.h"
#include "fb_protocol.h"

#define MAX_BULK (512ull * 1024 * 1024)
#define OPS_PER_SUB 1000u           /* protocol.MIN_SUB_OPS: every broker takes this many */
#define COMMANDS_PER_TURN 512       /* local replies before others get a turn */
#define HOLD_MAX (64u * 1024 * 1024) /* data held behind a subscribe reply, at most */

enum { WAIT_NONE, WAIT_WELCOME, WAIT_CONFIRM, WAIT_REPLY };
enum { K_SUB, K_PSUB, K_SSUB };      /* a pending subscribe command's kind */

#define F_CH 1u   /* a channel's entry: SUBSCRIBE */
#define F_SH 2u   /* ... SSUBSCRIBE */

/* -- a set of byte strings -------------------------------------------------------- */

typedef struct key {
    unsigned char *p;
    uint32_t n, hash;
    unsigned flags;
} key;

typedef struct kset {
    key *keys;                 /* dense: iterated in order of insertion (a removal moves the last) */
    uint32_t count, cap;
    uint32_t *index;           /* open addressing: key index + 1; 0 empty; UINT32_MAX a tombstone */
    uint32_t icap, iused;
} kset;

static uint32_t hash_bytes(const unsigned char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

/* The index slot of (p, n), or of where it would go: *found says which. */
static uint32_t kset_slot(const kset *s, const unsigned char *p, size_t n, uint32_t h, int *found)
{
    uint32_t mask = s->icap - 1, i = h & mask, tomb = UINT32_MAX;
    for (;;) {
        uint32_t v = s->index[i];
        if (v == 0) {
            *found = 0;
            return tomb != UINT32_MAX ? tomb : i;
        }
        if (v == UINT32_MAX) {
            if (tomb == UINT32_MAX) tomb = i;
        } else {
            const key *k = &s->keys[v - 1];
            if (k->hash == h && k->n == n && memcmp(k->p, p, n) == 0) {
                *found = 1;
                return i;
            }
        }
        i = (i + 1) & mask;
    }
}

static int kset_reindex(kset *s, uint32_t icap)
{
    uint32_t *ix = calloc(icap, sizeof *ix);
    if (!ix) return FB_ENOMEM;
    free(s->index);
    s->index = ix;
    s->icap = icap;
    s->iused = s->count;
    for (uint32_t k = 0; k < s->count; k++) {
        int found;
        uint32_t i = kset_slot(s, s->keys[k].p, s->keys[k].n, s->keys[k].hash, &found);
        s->index[i] = k + 1;
    }
    return FB_OK;
}

static key *kset_find(const kset *s, const unsigned char *p, size_t n)
{
    if (!s->count) return NULL;
    int found;
    uint32_t i = kset_slot(s, p, n, hash_bytes(p, n), &found);
    return found ? &s->keys[s->index[i] - 1] : NULL;
}

/* The entry of (p, n), added (flags 0) if it is not there; NULL: no memory. */
static key *kset_get(kset *s, const unsigned char *p, size_t n)
{
    key *k = kset_find(s, p, n);
    if (k) return k;
    /* Full (live keys and tombstones): rebuild, doubling only when the live
     * keys need it.  (Doubling every time let a client that subscribes and
     * unsubscribes new keys while holding one grow the index for ever:
     * each cycle left a tombstone, and every rebuild doubled.) */
    if ((s->iused + 1) * 4 >= s->icap * 3
        && kset_reindex(s, !s->icap ? 16 : (s->count + 1) * 2 >= s->icap ? s->icap * 2 : s->icap) < 0)
        return NULL;
    if (s->count == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 8;
        key *keys = realloc(s->keys, cap * sizeof *keys);
        if (!keys) return NULL;
        s->keys = keys;
        s->cap = cap;
    }
    unsigned char *copy = malloc(n ? n : 1);
    if (!copy) return NULL;
    memcpy(copy, p, n);
    uint32_t h = hash_bytes(p, n);
    int found;
    uint32_t i = kset_slot(s, p, n, h, &found);
    if (s->index[i] == 0) s->iused++;
    s->index[i] = s->count + 1;
    k = &s->keys[s->count++];
    k->p = copy;
    k->n = (uint32_t)n;
    k->hash = h;
    k->flags = 0;
    return k;
}

static void kset_remove(kset *s, key *k)
{
    int found;
    uint32_t i = kset_slot(s, k->p, k->n, k->hash, &found);
    s->index[i] = UINT32_MAX;
    free(k->p);
    uint32_t at = (uint32_t)(k - s->keys), last = s->count - 1;
    if (at != last) {
        s->keys[at] = s->keys[last];
        uint32_t j = kset_slot(s, s->keys[at].p, s->keys[at].n, s->keys[at].hash, &found);
        s->index[j] = at + 1;
    }
    s->count--;
    if (s->count == 0) {                         /* start clean: no tombstones left behind */
        memset(s->index, 0, s->icap * sizeof *s->index);
        s->iused = 0;
    }
}

static void kset_free(kset *s)
{
    for (uint32_t k = 0; k < s->count; k++) free(s->keys[k].p);
    free(s->keys);
    free(s->index);
    memset(s, 0, sizeof *s);
}

/* -- the session ------------------------------------------------------------------- */

struct fb_resp_session {
    uint64_t max_request;
    int resp3, authed, auth_required;
    int wait, closing;
    int pub_pending;             /* a PUBLISH given to the broker, not answered yet */
    int msg_ready;               /* a message waits to be taken (frames below) */
    uint64_t seq;                /* the last SUB's seq */

    kset chans, pats;
    uint32_t nch, nsh;           /* channels with F_CH, with F_SH */

    /* A subscribe command waiting for its CONFIRM: its kind, the keys it
     * named ([u32 n][u8 new][n bytes]...), the count before it, and
     * what REFUSED said about some of them. */
    int pend_kind;
    uint64_t pend_seq;
    fb_zbuf pend;
    uint32_t pend_before;
    char refused[200];
    size_t refused_len;
    fb_zbuf hold;                /* what the broker sent meanwhile, written after the replies */

    /* The message for the broker: frames in msg, [off, len) each. */
    fb_zbuf msg;
    size_t foff[3], flen[3];
    int nframes, next_frame;
    /* Subscription changes still to send ([u8 flags][u32 n][n bytes]...),
     * OPS_PER_SUB to a SUB. */
    fb_zbuf ops;
    uint32_t nops;

    /* The request being parsed: argc (0: not started, -1: inline), the
     * arguments found so far (offsets from the request's start), and
     * where parsing goes on. */
    long argc;
    size_t *aoff, *alen;
    uint32_t nargs, acap;
    size_t pos;

    char errbuf[64];             /* a protocol error's message */
    fb_record *recs;             /* for decoding DATA */
    size_t reccap;
    fb_resp_session_stats st;
};

/* -- writing RESP ------------------------------------------------------------------ */

static int put(fb_zbuf *b, const void *p, size_t n) { return fb_zbuf_put(b, p, n); }

/* "<type><v>\r\n", without printf (one per record of every push). */
static int put_line(fb_zbuf *b, char type, int64_t v)
{
    char t[32], *e = t + sizeof t, *p = e;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    *--p = '\n';
    *--p = '\r';
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    *--p = type;
    return put(b, p, (size_t)(e - p));
}

static int put_bulk(fb_zbuf *b, const void *p, size_t n)
{
    if (!p) return put(b, "$-1\r\n", 5);
    if (put_line(b, '$', (int64_t)n) < 0 || put(b, p, n) < 0) return -1;
    return put(b, "\r\n", 2);
}

static int put_str(fb_zbuf *b, const char *s) { return put_bulk(b, s, strlen(s)); }

/* A push message's header: ">n" in RESP3, an array in RESP2. */
static int put_push(fb_resp_session *r, fb_zbuf *b, int n) { return put_line(b, r->resp3 ? '>' : '*', n); }

static int put_error(fb_zbuf *b, const char *msg)
{
    if (put(b, "-", 1) < 0 || put(b, msg, strlen(msg)) < 0) return -1;
    return put(b, "\r\n", 2);
}

/* A (un)subscribe reply: [kind, name (or null), count]. */
static int put_sub_reply(fb_resp_session *r, fb_zbuf *b, const char *kind, const unsigned char *p, size_t n,
                         uint32_t count)
{
    if (put_push(r, b, 3) < 0 || put_str(b, kind) < 0) return -1;
    if (p ? put_bulk(b, p, n) < 0 : put(b, r->resp3 ? "_\r\n" : "$-1\r\n", r->resp3 ? 3 : 5) < 0) return -1;
    return put_line(b, ':', count);
}

/* -- messages for the broker ------------------------------------------------------ */

static int msg_frame(fb_resp_session *r, const void *p, size_t n)
{
    size_t at = r->msg.len;
    if (fb_zbuf_put(&r->msg, p, n) < 0) return FB_ENOMEM;
    r->foff[r->nframes] = at;
    r->flen[r->nframes] = n;
    r->nframes++;
    return FB_OK;
}

static void msg_start(fb_resp_session *r)
{
    r->msg.off = r->msg.len = 0;
    r->nframes = r->next_frame = 0;
}

static void put_u32le(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A batch frame of `count` records: its header; the records follow. */
static int batch_header(fb_resp_session *r, uint32_t count)
{
    unsigned char h[FB_BATCH_HEADER] = {FB_BATCH_MAGIC0, FB_BATCH_MAGIC1, FB_BATCH_VERSION, 0};
    put_u32le(h + 4, count);
    return fb_zbuf_put(&r->msg, h, sizeof h);
}

static int batch_record(fb_resp_session *r, const void *t, size_t tn, const void *p, size_t pn)
{
    unsigned char v[2 * FB_VARINT_MAX];
    size_t vn = fb_put_varint(v, (uint32_t)tn);
    vn += fb_put_varint(v + vn, (uint32_t)pn);
    if (fb_zbuf_put(&r->msg, v, vn) < 0 || fb_zbuf_put(&r->msg, t, tn) < 0 || fb_zbuf_put(&r->msg, p, pn) < 0)
        return FB_ENOMEM;
    return FB_OK;
}

static int make_hello(fb_resp_session *r)
{
    static const char hello[] = "{\"v\": 1, \"role\": \"redis\", \"pub\": false, \"name\": \"redis\"}";
    msg_start(r);
    if (msg_frame(r, FB_CMD_HELLO_S, 1) < 0 || msg_frame(r, hello, sizeof hello - 1) < 0) return FB_ENOMEM;
    r->msg_ready = 1;
    r->wait = WAIT_WELCOME;
    return FB_OK;
}

static int make_pub(fb_resp_session *r, const unsigned char *ch, size_t chn, const unsigned char *m, size_t mn)
{
    msg_start(r);
    if (msg_frame(r, FB_CMD_PUB_S, 1) < 0) return FB_ENOMEM;
    size_t at = r->msg.len;
    if (batch_header(r, 1) < 0 || batch_record(r, ch, chn, m, mn) < 0) return FB_ENOMEM;
    r->foff[r->nframes] = at;
    r->flen[r->nframes] = r->msg.len - at;
    r->nframes++;
    r->msg_ready = 1;
    r->pub_pending = 1;
    r->st.published++;
    return FB_OK;
}

/* A subscription change to send (flags as an ops batch's: bit 0 subscribe,
 * bit 2 a glob). */
static int queue_op(fb_resp_session *r, unsigned flags, const unsigned char *p, size_t n)
{
    unsigned char h[5];
    h[0] = (unsigned char)flags;
    put_u32le(h + 1, (uint32_t)n);
    if (fb_zbuf_put(&r->ops, h, 5) < 0 || fb_zbuf_put(&r->ops, p, n) < 0) return FB_ENOMEM;
    r->nops++;
    return FB_OK;
}

/* The next SUB, of up to OPS_PER_SUB queued changes. */
static int make_sub(fb_resp_session *r)
{
    uint32_t n = r->nops < OPS_PER_SUB ? r->nops : OPS_PER_SUB;
    unsigned char seq[8];
    r->seq++;
    for (int i = 0; i < 8; i++) seq[i] = (unsigned char)(r->seq >> (8 * i));
    msg_start(r);
    if (msg_frame(r, FB_CMD_SUB_S, 1) < 0 || msg_frame(r, seq, 8) < 0) return FB_ENOMEM;
    size_t at = r->msg.len;
    if (batch_header(r, n) < 0) return FB_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        const unsigned char *q = r->ops.p + r->ops.off;
        uint32_t kn = (uint32_t)q[1] | (uint32_t)q[2] << 8 | (uint32_t)q[3] << 16 | (uint32_t)q[4] << 24;
        unsigned char fl = q[0];
        if (batch_record(r, q + 5, kn, &fl, 1) < 0) return FB_ENOMEM;
        r->ops.off += 5 + kn;
    }
    r->nops -= n;
    if (!r->nops) r->ops.off = r->ops.len = 0;
    r->foff[r->nframes] = at;
    r->flen[r->nframes] = r->msg.len - at;
    r->nframes++;
    r->msg_ready = 1;
    return FB_OK;
}

/* -- the commands ----------------------------------------------------------------- */

typedef struct args {
    const unsigned char *base;
    const size_t *off, *len;
    uint32_t n;
} args;

#define ARG(a, i) ((a)->base + (a)->off[i])
#define ARGN(a, i) ((a)->len[i])

static int is(const args *a, uint32_t i, const char *name)
{
    size_t n = strlen(name);
    if (i >= a->n || ARGN(a, i) != n) return 0;
    for (size_t k = 0; k < n; k++) {
        unsigned char c = ARG(a, i)[k];
        if (c >= 'a' && c <= 'z') c = (unsigned char)(c - 32);
        if (c != (unsigned char)name[k]) return 0;
    }
    return 1;
}

/* "-ERR wrong number of arguments for 'x' command" (the name lower case). */
static int wrong_args(const args *a, fb_zbuf *out)
{
    char m[160];
    size_t n = ARGN(a, 0) < 64 ? ARGN(a, 0) : 64;
    int k = snprintf(m, sizeof m, "ERR wrong number of arguments for '");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = ARG(a, 0)[i];
        m[k++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : (c < 32 || c > 126) ? '?' : c);
    }
    snprintf(m + k, sizeof m - (size_t)k, "' command");
    return put_error(out, m);
}

static uint32_t sub_count(const fb_resp_session *r, int kind)
{
    return kind == K_SSUB ? r->nsh : r->nch + r->pats.count;
}

/* SUBSCRIBE / PSUBSCRIBE / SSUBSCRIBE: keys taken here now, changes queued
 * for the broker, the replies written at its CONFIRM (or now, when nothing
 * is new). */
static int subscribe(fb_resp_session *r, const args *a, int kind, fb_zbuf *out)
{
    uint32_t before = sub_count(r, kind);
    r->pend.off = r->pend.len = 0;
    for (uint32_t i = 1; i < a->n; i++) {
        const unsigned char *p = ARG(a, i);
        size_t n = ARGN(a, i);
        unsigned char fresh = 0;
        key *k = kset_get(kind == K_PSUB ? &r->pats : &r->chans, p, n);
        if (!k) return FB_ENOMEM;
        unsigned f = kind == K_SSUB ? F_SH : F_CH;
        if (kind == K_PSUB) {
            if (!k->flags) {
                k->flags = F_CH;
                fresh = 1;
                if (queue_op(r, 1u | 4u, p, n) < 0) return FB_ENOMEM;
            }
        } else if (!(k->flags & f)) {
            if (!k->flags && queue_op(r, 1u, p, n) < 0) return FB_ENOMEM;
            k->flags |= f;
            fresh = 1;
            if (kind == K_SSUB) r->nsh++;
            else r->nch++;
        }
        unsigned char h[5];
        put_u32le(h, (uint32_t)n);
        h[4] = fresh;
        if (fb_zbuf_put(&r->pend, h, 5) < 0 || fb_zbuf_put(&r->pend, p, n) < 0) return FB_ENOMEM;
    }
    r->pend_kind = kind;
    r->pend_before = before;
    r->refused_len = 0;
    if (!r->nops) {                              /* all held already: the replies now */
        static const char *const names[] = {"subscribe", "psubscribe", "ssubscribe"};
        const unsigned char *q = r->pend.p + r->pend.off, *end = r->pend.p + r->pend.len;
        while (q < end) {
            uint32_t n = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
            before += q[4];
            if (put_sub_reply(r, out, names[kind], q + 5, n, before) < 0) return FB_ENOMEM;
            q += 5 + n;
        }
        return FB_RESP_MORE;
    }
    r->wait = WAIT_CONFIRM;
    if (make_sub(r) < 0) return FB_ENOMEM;
    /* (A command over OPS_PER_SUB keys takes several SUBs: the reply waits
     * for the last one's CONFIRM.) */
    r->pend_seq = r->seq + (r->nops + OPS_PER_SUB - 1) / OPS_PER_SUB;
    return FB_RESP_MESSAGE;
}

/* The replies of the subscribe command that was waiting, then what was
 * held meanwhile. */
static int subscribed(fb_resp_session *r, fb_zbuf *out)
{
    static const char *const names[] = {"subscribe", "psubscribe", "ssubscribe"};
    uint32_t count = r->pend_before;
    const unsigned char *q = r->pend.p + r->pend.off, *end = r->pend.p + r->pend.len;
    kset *s = r->pend_kind == K_PSUB ? &r->pats : &r->chans;
    unsigned f = r->pend_kind == K_SSUB ? F_SH : F_CH;
    while (q < end) {
        uint32_t n = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
        key *k = kset_find(s, q + 5, n);
        if (!k || !(k->flags & f)) {             /* REFUSED took it out */
            char m[300];
            snprintf(m, sizeof m, "ERR subscription refused: %.*s", (int)r->refused_len, r->refused);
            if (put_error(out, m) < 0) return FB_ENOMEM;
        } else {
            count += q[4];
            if (put_sub_reply(r, out, names[r->pend_kind], q + 5, n, count) < 0) return FB_ENOMEM;
        }
        q += 5 + n;
    }
    r->pend.off = r->pend.len = 0;
    if (r->hold.len > r->hold.off && put(out, r->hold.p + r->hold.off, r->hold.len - r->hold.off) < 0)
        return FB_ENOMEM;
    fb_zbuf_free(&r->hold);
    r->wait = WAIT_NONE;
    return FB_RESP_RESUME;
}

/* Take key k's flag f away; the broker is told when nothing holds it. */
static int drop_key(fb_resp_session *r, kset *s, key *k, unsigned f, unsigned glob)
{
    if (s == &r->pats) {
        if (queue_op(r, glob, k->p, k->n) < 0) return FB_ENOMEM;
        kset_remove(s, k);
        return FB_OK;
    }
    k->flags &= ~f;
    if (f == F_SH) r->nsh--;
    else r->nch--;
    if (!k->flags) {
        if (queue_op(r, 0, k->p, k->n) < 0) return FB_ENOMEM;
        kset_remove(s, k);
    }
    return FB_OK;
}

/* UNSUBSCRIBE / PUNSUBSCRIBE / SUNSUBSCRIBE: in effect here at once (data
 * still on its way for the key is not delivered), so the replies go now. */
static int unsubscribe(fb_resp_session *r, const args *a, int kind, fb_zbuf *out)
{
    static const char *const names[] = {"unsubscribe", "punsubscribe", "sunsubscribe"};
    kset *s = kind == K_PSUB ? &r->pats : &r->chans;
    unsigned f = kind == K_SSUB ? F_SH : F_CH;
    if (a->n == 1) {                             /* all of them */
        int any = 0;
        for (uint32_t i = s->count; i-- > 0;) {
            key *k = &s->keys[i];
            if (!(k->flags & f)) continue;
            any = 1;
            if (put_sub_reply(r, out, names[kind], k->p, k->n, sub_count(r, kind) - 1) < 0) return FB_ENOMEM;
            if (drop_key(r, s, k, f, 4u) < 0) return FB_ENOMEM;
        }
        if (!any && put_sub_reply(r, out, names[kind], NULL, 0, sub_count(r, kind)) < 0) return FB_ENOMEM;
    } else {
        for (uint32_t i = 1; i < a->n; i++) {
            key *k = kset_find(s, ARG(a, i), ARGN(a, i));
            if (k && (k->flags & f) && drop_key(r, s, k, f, 4u) < 0) return FB_ENOMEM;
            if (put_sub_reply(r, out, names[kind], ARG(a, i), ARGN(a, i), sub_count(r, kind)) < 0)
                return FB_ENOMEM;
        }
    }
    if (!r->nops) return FB_RESP_MORE;
    return make_sub(r) < 0 ? FB_ENOMEM : FB_RESP_MESSAGE;
}

/* RESET: every key goes (iterated from the end, each removed: no key moves
 * into a place still to visit). */
static int unsubscribe_all(fb_resp_session *r)
{
    for (uint32_t i = r->pats.count; i-- > 0;) {
        if (queue_op(r, 4u, r->pats.keys[i].p, r->pats.keys[i].n) < 0) return FB_ENOMEM;
        kset_remove(&r->pats, &r->pats.keys[i]);
    }
    for (uint32_t i = r->chans.count; i-- > 0;) {
        if (queue_op(r, 0, r->chans.keys[i].p, r->chans.keys[i].n) < 0) return FB_ENOMEM;
        kset_remove(&r->chans, &r->chans.keys[i]);
    }
    r->nch = r->nsh = 0;
    return FB_OK;
}

/* Anything the broker's Python side answers: [r, state, the request as a
 * RESP array]. */
static int to_broker(fb_resp_session *r, const args *a)
{
    unsigned char state = (unsigned char)((r->resp3 ? FB_RESP_STATE_RESP3 : 0) | (r->authed ? FB_RESP_STATE_AUTHED : 0)
                                          | (r->auth_required ? FB_RESP_STATE_NEED_AUTH : 0)
                                          | (r->nch + r->nsh + r->pats.count ? FB_RESP_STATE_SUBSCRIBED : 0));
    msg_start(r);
    if (msg_frame(r, FB_CMD_RESP_REQUEST_S, 1) < 0 || msg_frame(r, &state, 1) < 0) return FB_ENOMEM;
    size_t at = r->msg.len;
    if (put_line(&r->msg, '*', a->n) < 0) return FB_ENOMEM;
    for (uint32_t i = 0; i < a->n; i++)
        if (put_bulk(&r->msg, ARG(a, i), ARGN(a, i)) < 0) return FB_ENOMEM;
    r->foff[r->nframes] = at;
    r->flen[r->nframes] = r->msg.len - at;
    r->nframes++;
    r->msg_ready = 1;
    r->wait = WAIT_REPLY;
    return FB_RESP_MESSAGE;
}

/* One whole request: FB_RESP_MORE (answered here), _MESSAGE, _CLOSE, or FB_ENOMEM. */
static int command(fb_resp_session *r, const args *a, fb_zbuf *out)
{
    int subscribed_mode = !r->resp3 && (r->nch + r->nsh + r->pats.count) > 0;
    r->st.requests++;
    if (!r->authed && !is(a, 0, "AUTH") && !is(a, 0, "HELLO") && !is(a, 0, "QUIT") && !is(a, 0, "RESET"))
        return put_error(out, "NOAUTH Authentication required.") < 0 ? FB_ENOMEM : FB_RESP_MORE;
    if (is(a, 0, "PUBLISH") || is(a, 0, "SPUBLISH")) {
        if (subscribed_mode) goto not_in_context;
        if (a->n != 3) return wrong_args(a, out) < 0 ? FB_ENOMEM : FB_RESP_MORE;
        return make_pub(r, ARG(a, 1), ARGN(a, 1), ARG(a, 2), ARGN(a, 2)) < 0 ? FB_ENOMEM : FB_RESP_MESSAGE;
    }
    static const char *const subs[] = {"SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE"};
    static const char *const unsubs[] = {"UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE"};
    for (int kind = 0; kind < 3; kind++) {
        if (is(a, 0, subs[kind])) {
            if (a->n < 2) return wrong_args(a, out) < 0 ? FB_ENOMEM : FB_RESP_MORE;
            return subscribe(r, a, kind, out);
        }
        if (is(a, 0, unsubs[kind])) return unsubscribe(r, a, kind, out);
    }
    if (is(a, 0, "PING")) {
        if (a->n > 2) return wrong_args(a, out) < 0 ? FB_ENOMEM : FB_RESP_MORE;
        int rc;
        if (subscribed_mode)
            rc = put(out, "*2\r\n$4\r\npong\r\n", 14) < 0 || put_bulk(out, a->n == 2 ? ARG(a, 1) : (const unsigned char *)"",
                                                                      a->n == 2 ? ARGN(a, 1) : 0) < 0 ? -1 : 0;
        else
            rc = a->n == 2 ? put_bulk(out, ARG(a, 1), ARGN(a, 1)) : put(out, "+PONG\r\n", 7);
        return rc < 0 ? FB_ENOMEM : FB_RESP_MORE;
    }
    if (is(a, 0, "QUIT")) {
        r->closing = 1;
        return put(out, "+OK\r\n", 5) < 0 ? FB_ENOMEM : FB_RESP_CLOSE;
    }
    if (subscribed_mode && !is(a, 0, "RESET")) goto not_in_context;
    if (is(a, 0, "ECHO")) {
        if (a->n != 2) return wrong_args(a, out) < 0 ? FB_ENOMEM : FB_RESP_MORE;
        return put_bulk(out, ARG(a, 1), ARGN(a, 1)) < 0 ? FB_ENOMEM : FB_RESP_MORE;
    }
    if (is(a, 0, "RESET")) {
        if (unsubscribe_all(r) < 0) return FB_ENOMEM;
        r->resp3 = 0;
        r->authed = !r->auth_required;
        if (put(out, "+RESET\r\n", 8) < 0) return FB_ENOMEM;
        if (!r->nops) return FB_RESP_MORE;
        return make_sub(r) < 0 ? FB_ENOMEM : FB_RESP_MESSAGE;
    }
    return to_broker(r, a);

not_in_context: {
        char m[200];
        size_t n = ARGN(a, 0) < 32 ? ARGN(a, 0) : 32;
        char name[33];
        for (size_t i = 0; i < n; i++) {
            unsigned char c = ARG(a, 0)[i];
            name[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : (c < 32 || c > 126) ? '?' : c);
        }
        name[n] = 0;
        snprintf(m, sizeof m, "ERR Can't execute '%s': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / "
                              "RESET are allowed in this context", name);
        return put_error(out, m) < 0 ? FB_ENOMEM : FB_RESP_MORE;
    }
}

/* -- the request parser ------------------------------------------------------------ */

enum { P_NEED = 0, P_DONE = 1, P_EMPTY = 2, P_BAD = 3 };   /* (and FB_ENOMEM) */

/* The integer of a "<type><digits>\r\n" line at in[at]: P_DONE with *v and
 * *next, P_NEED if the line is not all here, or P_BAD (*err = what). */
static int read_line_int(const unsigned char *in, size_t len, size_t at, long long *v, size_t *next,
                         const char **err, const char *what)
{
    size_t i = at + 1, lim = at + 24;            /* a type byte, at most 20 digits and a sign, CRLF */
    long long x = 0;
    int neg = 0, digits = 0;
    if (i < len && in[i] == '-') {
        neg = 1;
        i++;
    }
    for (; i < len && i < lim; i++) {
        unsigned char c = in[i];
        if (c == '\r') break;
        if (c < '0' || c > '9' || digits >= 18) {
            *err = what;
            return P_BAD;
        }
        x = x * 10 + (c - '0');
        digits++;
    }
    if (i >= len || i + 1 >= len) {
        if (i >= lim) {
            *err = what;
            return P_BAD;
        }
        return P_NEED;
    }
    if (in[i] != '\r' || in[i + 1] != '\n' || !digits) {
        *err = what;
        return P_BAD;
    }
    *v = neg ? -x : x;
    *next = i + 2;
    return P_DONE;
}

static int add_arg(fb_resp_session *r, size_t off, size_t n)
{
    if (r->nargs == r->acap) {
        uint32_t cap = r->acap ? r->acap * 2 : 8;
        size_t *o = realloc(r->aoff, cap * sizeof *o);
        if (!o) return FB_ENOMEM;
        r->aoff = o;
        size_t *l = realloc(r->alen, cap * sizeof *l);
        if (!l) return FB_ENOMEM;
        r->alen = l;
        r->acap = cap;
    }
    r->aoff[r->nargs] = off;
    r->alen[r->nargs] = n;
    r->nargs++;
    return FB_OK;
}

/* Parse on from r->pos: P_DONE (r's args are the request, r->pos its
 * size), P_EMPTY (an empty request of r->pos bytes), P_NEED, FB_ENOMEM, or
 * P_BAD with *err (not RESP). */
static int parse(fb_resp_session *r, const unsigned char *in, size_t len, const char **err)
{
    if (r->argc == 0) {                          /* a new request */
        if (!len) return P_NEED;
        if (in[0] != '*') {                      /* an inline command: words up to a newline */
            size_t max = len < FB_RESP_MAX_INLINE ? len : FB_RESP_MAX_INLINE;
            const unsigned char *nl = memchr(in, '\n', max);
            if (!nl) {
                if (len >= FB_RESP_MAX_INLINE) {
                    *err = "Protocol error: too big inline request";
                    return P_BAD;
                }
                return P_NEED;
            }
            size_t end = (size_t)(nl - in);
            if (end && in[end - 1] == '\r') end--;
            r->nargs = 0;
            for (size_t i = 0; i < end;) {
                while (i < end && (in[i] == ' ' || in[i] == '\t')) i++;
                size_t s = i;
                while (i < end && in[i] != ' ' && in[i] != '\t') i++;
                if (i > s && add_arg(r, s, i - s) < 0) return FB_ENOMEM;
            }
            r->pos = (size_t)(nl - in) + 1;
            return r->nargs ? P_DONE : P_EMPTY;
        }
        long long n;
        size_t next;
        int rc = read_line_int(in, len, 0, &n, &next, err, "Protocol error: invalid multibulk length");
        if (rc != P_DONE) return rc;
        if (n > (long long)FB_RESP_MAX_ARGS) {
            *err = "Protocol error: invalid multibulk length";
            return P_BAD;
        }
        if (n <= 0) {
            r->pos = next;
            return P_EMPTY;
        }
        r->argc = (long)n;
        r->nargs = 0;
        r->pos = next;
    }
    while (r->nargs < (uint32_t)r->argc) {
        size_t at = r->pos;
        if (at >= len) return P_NEED;
        if (in[at] != '$') {
            char *m = r->errbuf;
            snprintf(m, sizeof r->errbuf, "Protocol error: expected '$', got '%c'",
                     in[at] >= 32 && in[at] < 127 ? in[at] : '?');
            *err = m;
            return P_BAD;
        }
        long long n;
        size_t next;
        int rc = read_line_int(in, len, at, &n, &next, err, "Protocol error: invalid bulk length");
        if (rc != P_DONE) return rc;
        if (n < 0 || (unsigned long long)n > MAX_BULK || next + (unsigned long long)n + 2 > r->max_request) {
            *err = "Protocol error: invalid bulk length";
            return P_BAD;
        }
        if (next + (size_t)n + 2 > len) return P_NEED;
        if (in[next + (size_t)n] != '\r' || in[next + (size_t)n + 1] != '\n') {
            *err = "Protocol error: expected CRLF after a bulk string";
            return P_BAD;
        }
        if (add_arg(r, next, (size_t)n) < 0) return FB_ENOMEM;
        r->pos = next + (size_t)n + 2;
    }
    return P_DONE;
}

int fb_resp_session_input(fb_resp_session *r, const unsigned char *in, size_t len, size_t *used, fb_zbuf *out)
{
    *used = 0;
    if (r->pub_pending) {                        /* routed where no count came back (see header) */
        r->pub_pending = 0;
        if (put(out, ":0\r\n", 4) < 0) return FB_ENOMEM;
    }
    if (r->msg_ready) return FB_RESP_MESSAGE;
    if (r->nops) {                               /* the rest of a long (un)subscribe */
        return make_sub(r) < 0 ? FB_ENOMEM : FB_RESP_MESSAGE;
    }
    if (r->closing) return FB_RESP_CLOSE;
    if (r->wait) return FB_RESP_WAIT;
    for (int turn = 0; turn < COMMANDS_PER_TURN; turn++) {
        const char *err = NULL;
        int rc = parse(r, in + *used, len - *used, &err);
        if (rc == P_NEED) return FB_RESP_MORE;
        if (rc == FB_ENOMEM) return rc;
        if (rc == P_BAD) {
            char m[128];
            snprintf(m, sizeof m, "ERR %s", err);
            r->closing = 1;
            return put_error(out, m) < 0 ? FB_ENOMEM : FB_RESP_CLOSE;
        }
        size_t size = r->pos;
        args a = {in + *used, r->aoff, r->alen, r->nargs};
        r->argc = 0;
        r->pos = 0;
        if (rc == P_EMPTY) {
            *used += size;
            continue;
        }
        rc = command(r, &a, out);
        *used += size;                           /* (the message's frames are copies: the input may go) */
        if (r->acap > 4096) {                    /* after a very long request: give its room back */
            free(r->aoff);
            free(r->alen);
            r->aoff = r->alen = NULL;
            r->acap = 0;
        }
        r->nargs = 0;
        if (rc != FB_RESP_MORE) return rc;
    }
    return FB_RESP_YIELD;
}

int fb_resp_session_frame(fb_resp_session *r, const unsigned char **p, size_t *n)
{
    if (!r->msg_ready || r->next_frame >= r->nframes) return -1;
    int i = r->next_frame++;
    *p = r->msg.p + r->foff[i];
    *n = r->flen[i];
    if (r->next_frame < r->nframes) return 1;
    r->msg_ready = 0;
    return 0;
}

int fb_resp_session_pending(const fb_resp_session *r)
{
    return r->msg_ready || r->nops;
}

void fb_resp_session_routed(fb_resp_session *r, uint64_t receivers, uint64_t over, fb_zbuf *out)
{
    if (!r->pub_pending) return;
    r->pub_pending = 0;
    if (over)
        put_error(out, "ERR message over the broker's --max-payload or --max-topic: not published");
    else
        put_line(out, ':', (int64_t)(receivers > INT64_MAX ? INT64_MAX : receivers));
}

/* -- the broker's messages ------------------------------------------------------- */

static uint64_t get_u64(const fb_resp_frame *f)
{
    uint64_t v = 0;
    for (size_t i = 0; i < 8 && i < f->n; i++) v |= (uint64_t)f->p[i] << (8 * i);
    return v;
}

/* Digits of a length, written backwards ending at e: where they start. */
static char *digits_before(char *e, uint64_t u)
{
    do {
        *--e = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    return e;
}

static unsigned char *put_bulk_at(unsigned char *w, const unsigned char *p, size_t n)
{
    char t[24], *e = t + sizeof t, *d = digits_before(e, n);
    *w++ = '$';
    memcpy(w, d, (size_t)(e - d));
    w += e - d;
    *w++ = '\r';
    *w++ = '\n';
    if (n) memcpy(w, p, n);
    w += n;
    *w++ = '\r';
    *w++ = '\n';
    return w;
}

/* One push of a record: [kind, (pattern,) channel, payload], the room
 * reserved once (this runs for every record delivered). */
static int put_message(fb_resp_session *r, fb_zbuf *b, const char *kind, size_t kindlen, const key *pat,
                       const fb_record *rec)
{
    size_t need = 4 + kindlen + 2 * 16 + rec->topic_len + rec->payload_len + (pat ? 16 + pat->n : 0);
    if (fb_zbuf_reserve(b, need) < 0) return FB_ENOMEM;
    unsigned char *w = b->p + b->len;
    *w++ = r->resp3 ? '>' : '*';
    *w++ = pat ? '4' : '3';
    *w++ = '\r';
    *w++ = '\n';
    memcpy(w, kind, kindlen);
    w += kindlen;
    if (pat) w = put_bulk_at(w, pat->p, pat->n);
    w = put_bulk_at(w, rec->topic, rec->topic_len);
    w = put_bulk_at(w, rec->payload, rec->payload_len);
    b->len = (size_t)(w - b->p);
    return FB_OK;
}

/* A DATA batch as pushes: "message" for a channel, "smessage" for a shard
 * channel, a "pmessage" for each pattern that matches. */
static int data(fb_resp_session *r, const fb_resp_frame *batch, fb_zbuf *out)
{
    uint32_t count;
    uint8_t flags;
    size_t n;
    if (fb_batch_header(batch->p, batch->n, &count, &flags) != FB_OK) return FB_OK;
    if (count > r->reccap) {
        fb_record *recs = realloc(r->recs, (size_t)count * sizeof *recs);
        if (!recs) return FB_ENOMEM;
        r->recs = recs;
        r->reccap = count;
    }
    if (fb_batch_decode(batch->p, batch->n, NULL, r->recs, r->reccap, &n) != FB_OK) return FB_OK;
    fb_zbuf *b = r->wait == WAIT_CONFIRM ? &r->hold : out;
    for (size_t i = 0; i < n; i++) {
        const fb_record *rec = &r->recs[i];
        key *k = kset_find(&r->chans, rec->topic, rec->topic_len);
        if (k && (k->flags & F_CH)) {
            if (put_message(r, b, "$7\r\nmessage\r\n", 13, NULL, rec) < 0) return FB_ENOMEM;
            r->st.delivered++;
        }
        if (k && (k->flags & F_SH)) {
            if (put_message(r, b, "$8\r\nsmessage\r\n", 14, NULL, rec) < 0) return FB_ENOMEM;
            r->st.delivered++;
        }
        for (uint32_t j = 0; j < r->pats.count; j++) {
            const key *pk = &r->pats.keys[j];
            if (!fb_glob_match(pk->p, pk->n, rec->topic, rec->topic_len)) continue;
            if (put_message(r, b, "$8\r\npmessage\r\n", 14, pk, rec) < 0) return FB_ENOMEM;
            r->st.delivered++;
        }
    }
    if (b == &r->hold && r->hold.len - r->hold.off > HOLD_MAX) {
        r->closing = 1;                          /* (as KICK: input says CLOSE from now on too) */
        return FB_RESP_CLOSE;
    }
    return FB_OK;
}

/* REFUSED [N, seq, ops, json]: the keys it names are not held. */
static int refused(fb_resp_session *r, const fb_resp_frame *f, int n)
{
    if (n < 4) return FB_OK;
    uint32_t count;
    uint8_t flags;
    size_t got;
    if (fb_batch_header(f[2].p, f[2].n, &count, &flags) != FB_OK) return FB_OK;
    if (count > r->reccap) {
        fb_record *recs = realloc(r->recs, (size_t)count * sizeof *recs);
        if (!recs) return FB_ENOMEM;
        r->recs = recs;
        r->reccap = count;
    }
    if (fb_batch_decode(f[2].p, f[2].n, NULL, r->recs, r->reccap, &got) != FB_OK) return FB_OK;
    for (size_t i = 0; i < got; i++) {
        const fb_record *rec = &r->recs[i];
        unsigned fl = rec->payload_len ? rec->payload[0] : 0;
        if (!(fl & 1)) continue;
        kset *s = (fl & 4) ? &r->pats : &r->chans;
        key *k = kset_find(s, rec->topic, rec->topic_len);
        if (!k) continue;
        if (s == &r->chans) {
            if (k->flags & F_CH) r->nch--;
            if (k->flags & F_SH) r->nsh--;
        }
        kset_remove(s, k);
    }
    /* The reason, from {"reason": "..."}: the text between its quotes. */
    const unsigned char *j = f[3].p, *end = f[3].p + f[3].n;
    const unsigned char *at = NULL;
    for (const unsigned char *q = j; q + 9 < end; q++)
        if (memcmp(q, "\"reason\":", 9) == 0) {
            at = q + 9;
            break;
        }
    r->refused_len = 0;
    if (at) {
        while (at < end && *at != '"') at++;
        /* (Past the quote only if there is one: at + 1 beyond end is undefined.) */
        for (at += at < end; at < end && *at != '"' && r->refused_len < sizeof r->refused; at++)
            r->refused[r->refused_len++] = (char)(*at < 32 ? ' ' : *at);
    }
    return FB_OK;
}

int fb_resp_session_deliver(fb_resp_session *r, const fb_resp_frame *f, int n, fb_zbuf *out)
{
    if (n < 1 || f[0].n != 1) return FB_OK;
    switch (f[0].p[0]) {
    case FB_CMD_DATA:
        return n == 3 ? data(r, &f[2], out) : FB_OK;
    case FB_CMD_WELCOME:
        if (r->wait != WAIT_WELCOME) return FB_OK;
        r->wait = WAIT_NONE;
        return FB_RESP_RESUME;
    case FB_CMD_CONFIRM:
        if (r->wait != WAIT_CONFIRM || n < 2 || get_u64(&f[1]) < r->pend_seq) return FB_OK;
        return subscribed(r, out);
    case FB_CMD_REFUSED:
        return refused(r, f, n);
    case FB_CMD_RESP_REQUEST: {
        if (r->wait != WAIT_REPLY) return FB_OK;
        if (n >= 2 && put(out, f[1].p, f[1].n) < 0) return FB_ENOMEM;
        r->wait = WAIT_NONE;
        if (n >= 3 && f[2].n == 1) {
            unsigned st = f[2].p[0];
            r->resp3 = (st & FB_RESP_STATE_RESP3) != 0;
            r->authed = (st & FB_RESP_STATE_AUTHED) != 0 || !r->auth_required;
            if (st & FB_RESP_STATE_CLOSE) {
                r->closing = 1;
                return FB_RESP_CLOSE;
            }
        }
        return FB_RESP_RESUME;
    }
    case FB_CMD_KICK:                                    /* the session ended (a slow consumer): Redis closes */
        r->closing = 1;
        return FB_RESP_CLOSE;
    case FB_CMD_GAP:
        if (n >= 2) r->st.gaps_lost += get_u64(&f[1]);
        return FB_OK;
    default:                                     /* PING, PONG, WANT, FLOW, TOOK, NOTICE, STATS, BYE */
        return FB_OK;
    }
}

fb_resp_session *fb_resp_session_new(uint64_t max_request, int auth_required)
{
    fb_resp_session *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->max_request = max_request ? max_request : MAX_BULK;
    r->auth_required = auth_required != 0;
    r->authed = !auth_required;
    if (make_hello(r) < 0) {
        fb_resp_session_free(r);
        return NULL;
    }
    return r;
}

void fb_resp_session_free(fb_resp_session *r)
{
    if (!r) return;
    kset_free(&r->chans);
    kset_free(&r->pats);
    fb_zbuf_free(&r->pend);
    fb_zbuf_free(&r->hold);
    fb_zbuf_free(&r->msg);
    fb_zbuf_free(&r->ops);
    free(r->aoff);
    free(r->alen);
    free(r->recs);
    free(r);
}

void fb_resp_session_get_stats(const fb_resp_session *r, fb_resp_session_stats *st)
{
    *st = r->st;
}
