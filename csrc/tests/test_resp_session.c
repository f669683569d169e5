/* Tests of fb_resp_session: a Redis client's connection translated into
 * fastbus session messages, driven without sockets.  Requests go in as
 * byte buffers (fb_resp_session_input), the messages for the broker come
 * out frame by frame (fb_resp_session_frame), and the broker's answers go
 * in as frames (fb_resp_session_deliver, fb_resp_session_routed); replies
 * are read back from the fb_zbuf they are written to.
 *
 * (Over 700 lines because it drives every command a Redis client sends, in
 * both protocols, through the one session under test.)
 */
#include "ctest.h"
#include "fb_batch.h"
#include "fb_common.h"
#include "fb_resp_session.h"
#include "fb_zmtp_wire.h"

#include <stdarg.h>
#include <stdint.h>
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
#include <malloc.h>
#if __GLIBC_PREREQ(2, 33)
#define HAVE_MALLINFO2 1
#endif
#endif

/* -- helpers ---------------------------------------------------------------------- */

#define U(s) ((const unsigned char *)(s))

static void zput(fb_zbuf *b, const void *p, size_t n) { REQUIRE(fb_zbuf_put(b, p, n) == 0); }
static void zputs(fb_zbuf *b, const char *s) { zput(b, s, strlen(s)); }
static void zprintf(fb_zbuf *b, const char *fmt, ...)
{
    char t[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    REQUIRE(n >= 0 && (size_t)n < sizeof t);
    zput(b, t, (size_t)n);
}
static size_t zlen(const fb_zbuf *b) { return b->len - b->off; }
static const unsigned char *zdata(const fb_zbuf *b) { return b->p ? b->p + b->off : U(""); }
static void zclear(fb_zbuf *b) { b->off = b->len = 0; }

static int has(const unsigned char *p, size_t n, const char *s)
{
    size_t k = strlen(s);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(p + i, s, k) == 0) return 1;
    return 0;
}

static size_t count_of(const unsigned char *p, size_t n, const char *s)
{
    size_t k = strlen(s), c = 0;
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(p + i, s, k) == 0) c++;
    return c;
}

static void show(const char *what, const unsigned char *p, size_t n)
{
    fprintf(stderr, "    %s (%zu bytes): \"", what, n);
    for (size_t i = 0; i < n && i < 300; i++) {
        unsigned char c = p[i];
        if (c == '\r') fputs("\\r", stderr);
        else if (c == '\n') fputs("\\n", stderr);
        else if (c < 32 || c > 126) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fputs(n > 300 ? "\"...\n" : "\"\n", stderr);
}

/* Is what `out` holds exactly want?  Either way `out` is emptied. */
static int out_eq(fb_zbuf *out, const void *want, size_t wn, const char *file, int line)
{
    int ok = zlen(out) == wn && memcmp(zdata(out), want, wn) == 0;
    if (!ok) {
        if (ctest_failures < 20) {
            fprintf(stderr, "%s:%d: output differs\n", file, line);
            show("got ", zdata(out), zlen(out));
            show("want", want, wn);
        }
        ctest_failures++;
    }
    zclear(out);
    return ok;
}
#define OUT(o, lit) out_eq((o), (lit), sizeof(lit) - 1, __FILE__, __LINE__)
#define OUTZ(o, z) out_eq((o), zdata(z), zlen(z), __FILE__, __LINE__)

/* A request: a RESP array of bulk strings. */
static void cmd_argv(fb_zbuf *b, int n, const char *const *w, const size_t *wn)
{
    zprintf(b, "*%d\r\n", n);
    for (int i = 0; i < n; i++) {
        size_t k = wn ? wn[i] : strlen(w[i]);
        zprintf(b, "$%zu\r\n", k);
        zput(b, w[i], k);
        zput(b, "\r\n", 2);
    }
}

/* ... of the words of `words` (split at spaces). */
static void cmd_words(fb_zbuf *b, const char *words)
{
    const char *w[64];
    size_t wn[64];
    int n = 0;
    for (const char *p = words; *p;) {
        while (*p == ' ') p++;
        if (!*p) break;
        const char *s = p;
        while (*p && *p != ' ') p++;
        REQUIRE(n < 64);
        w[n] = s;
        wn[n] = (size_t)(p - s);
        n++;
    }
    cmd_argv(b, n, w, wn);
}

/* Expected replies and pushes. */
static void e_bulk(fb_zbuf *e, const char *s) { zprintf(e, "$%zu\r\n", strlen(s)); zputs(e, s); zputs(e, "\r\n"); }
static void e_sub(fb_zbuf *e, int resp3, const char *kind, const char *name, long count)
{
    zputs(e, resp3 ? ">3\r\n" : "*3\r\n");
    e_bulk(e, kind);
    if (name) e_bulk(e, name);
    else zputs(e, resp3 ? "_\r\n" : "$-1\r\n");
    zprintf(e, ":%ld\r\n", count);
}
static void e_msg(fb_zbuf *e, int resp3, const char *kind, const char *ch, const char *payload)
{
    zputs(e, resp3 ? ">3\r\n" : "*3\r\n");
    e_bulk(e, kind);
    e_bulk(e, ch);
    e_bulk(e, payload);
}
static void e_pmsg(fb_zbuf *e, int resp3, const char *pat, const char *ch, const char *payload)
{
    zputs(e, resp3 ? ">4\r\n" : "*4\r\n");
    e_bulk(e, "pmessage");
    e_bulk(e, pat);
    e_bulk(e, ch);
    e_bulk(e, payload);
}

/* A message the session made: copies of its frames. */
#define MAXF 8
typedef struct msg {
    int n;
    unsigned char *f[MAXF];
    size_t len[MAXF];
} msg;

static void msg_free(msg *m)
{
    for (int i = 0; i < m->n; i++) free(m->f[i]);
    memset(m, 0, sizeof *m);
}

/* Take the ready message (after FB_RESP_MESSAGE), frame by frame. */
static void take(fb_resp_session *r, msg *m)
{
    msg_free(m);
    for (;;) {
        const unsigned char *p = NULL;
        size_t n = 0;
        int more = fb_resp_session_frame(r, &p, &n);
        REQUIRE(more == 0 || more == 1);
        REQUIRE(m->n < MAXF);
        m->f[m->n] = malloc(n ? n : 1);
        REQUIRE(m->f[m->n]);
        memcpy(m->f[m->n], p, n);
        m->len[m->n++] = n;
        if (!more) break;
    }
    const unsigned char *p;
    size_t n;
    CHECK_EQ(fb_resp_session_frame(r, &p, &n), -1);   /* all taken */
}

static int frame_is(const msg *m, int i, const char *s)
{
    return i < m->n && m->len[i] == strlen(s) && memcmp(m->f[i], s, m->len[i]) == 0;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The records of a batch frame (views into m). */
static size_t decode(const msg *m, int i, fb_record *recs, size_t cap)
{
    size_t n = 0;
    REQUIRE(i < m->n);
    int rc = fb_batch_decode(m->f[i], m->len[i], NULL, recs, cap, &n);
    CHECK_EQ(rc, FB_OK);
    return rc == FB_OK ? n : 0;
}

static int rec_is(const fb_record *r, const char *topic, const void *payload, size_t pn)
{
    return r->topic_len == strlen(topic) && memcmp(r->topic, topic, r->topic_len) == 0 && r->payload_len == pn
           && memcmp(r->payload, payload, pn) == 0;
}

/* A SUB message: its seq (0 if it is not a well-formed SUB), its ops in
 * recs. */
static uint64_t sub_of(const msg *m, fb_record *recs, size_t cap, size_t *nops)
{
    *nops = 0;
    CHECK_EQ(m->n, 3);
    CHECK(frame_is(m, 0, "S"));
    CHECK_EQ(m->len[1], 8);
    if (m->n != 3 || !frame_is(m, 0, "S") || m->len[1] != 8) return 0;
    *nops = decode(m, 2, recs, cap);
    return le64(m->f[1]);
}

/* A SUB of the ops "key:flags key:flags ...": its seq. */
static uint64_t check_sub_(const msg *m, const char *ops, const char *file, int line)
{
    fb_record recs[64];
    size_t n;
    uint64_t seq = sub_of(m, recs, 64, &n);
    size_t k = 0;
    int ok = 1;
    for (const char *p = ops; *p;) {
        while (*p == ' ') p++;
        if (!*p) break;
        const char *s = p;
        while (*p != ':') p++;
        size_t kn = (size_t)(p - s);
        unsigned flags = (unsigned)strtoul(p + 1, NULL, 10);
        while (*p && *p != ' ') p++;
        if (k >= n || recs[k].topic_len != kn || memcmp(recs[k].topic, s, kn) != 0 || recs[k].payload_len != 1
            || recs[k].payload[0] != flags)
            ok = 0;
        k++;
    }
    if (k != n) ok = 0;
    if (!ok) {
        ctest_fail(file, line, "SUB's ops differ");
        if (ctest_failures < 20) {
            fprintf(stderr, "    want %s; got", ops);
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, " %.*s:%u", (int)recs[i].topic_len, (const char *)recs[i].topic,
                        recs[i].payload_len ? recs[i].payload[0] : 999u);
            fputc('\n', stderr);
        }
    }
    return seq;
}
#define CHECK_SUB(m, ops) check_sub_((m), (ops), __FILE__, __LINE__)

/* -- the broker's messages ------------------------------------------------------- */

static int dl(fb_resp_session *r, fb_zbuf *out, const fb_resp_frame *f, int n)
{
    return fb_resp_session_deliver(r, f, n, out);
}

static const char WELCOME_JSON[] = "{\"v\": 1, \"instance\": \"i\", \"name\": \"redis\", \"globs\": true}";

static int d_welcome(fb_resp_session *r, fb_zbuf *out)
{
    fb_resp_frame f[2] = {{U("h"), 1}, {U(WELCOME_JSON), sizeof WELCOME_JSON - 1}};
    return dl(r, out, f, 2);
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int d_confirm(fb_resp_session *r, fb_zbuf *out, uint64_t seq)
{
    unsigned char s[8];
    put64(s, seq);
    fb_resp_frame f[2] = {{U("c"), 1}, {s, 8}};
    return dl(r, out, f, 2);
}

static void batch_header(fb_zbuf *b, uint32_t count)
{
    unsigned char h[8] = {FB_BATCH_MAGIC0, FB_BATCH_MAGIC1, FB_BATCH_VERSION, 0,
                          (unsigned char)count, (unsigned char)(count >> 8), (unsigned char)(count >> 16),
                          (unsigned char)(count >> 24)};
    zput(b, h, 8);
}

static void batch_record(fb_zbuf *b, const void *t, size_t tn, const void *p, size_t pn)
{
    unsigned char v[2 * FB_VARINT_MAX];
    size_t vn = fb_put_varint(v, (uint32_t)tn);
    vn += fb_put_varint(v + vn, (uint32_t)pn);
    zput(b, v, vn);
    zput(b, t, tn);
    zput(b, p, pn);
}

/* DATA [D, seq, batch of (topic, payload) NUL-terminated pairs]. */
static int d_data(fb_resp_session *r, fb_zbuf *out, uint64_t seq, int n, ...)
{
    fb_zbuf b = {0};
    batch_header(&b, (uint32_t)n);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        const char *t = va_arg(ap, const char *), *p = va_arg(ap, const char *);
        batch_record(&b, t, strlen(t), p, strlen(p));
    }
    va_end(ap);
    unsigned char s[8];
    put64(s, seq);
    fb_resp_frame f[3] = {{U("D"), 1}, {s, 8}, {zdata(&b), zlen(&b)}};
    int rc = dl(r, out, f, 3);
    fb_zbuf_free(&b);
    return rc;
}

/* REFUSED [N, seq, ops batch of (key, flags) pairs, json]. */
static int d_refused(fb_resp_session *r, fb_zbuf *out, uint64_t seq, const char *json, int n, ...)
{
    fb_zbuf b = {0};
    batch_header(&b, (uint32_t)n);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        const char *k = va_arg(ap, const char *);
        unsigned char fl = (unsigned char)va_arg(ap, int);
        batch_record(&b, k, strlen(k), &fl, 1);
    }
    va_end(ap);
    unsigned char s[8];
    put64(s, seq);
    fb_resp_frame f[4] = {{U("N"), 1}, {s, 8}, {zdata(&b), zlen(&b)}, {U(json), strlen(json)}};
    int rc = dl(r, out, f, 4);
    fb_zbuf_free(&b);
    return rc;
}

/* The Python side's answer [r, reply (, state)]: state < 0, no state frame. */
static int d_reply(fb_resp_session *r, fb_zbuf *out, const char *reply, int state)
{
    unsigned char st = (unsigned char)state;
    fb_resp_frame f[3] = {{U("r"), 1}, {U(reply), strlen(reply)}, {&st, 1}};
    return dl(r, out, f, state < 0 ? 2 : 3);
}

static int d_kick(fb_resp_session *r, fb_zbuf *out)
{
    static const char j[] = "{\"reason\": \"slow consumer\"}";
    fb_resp_frame f[2] = {{U("X"), 1}, {U(j), sizeof j - 1}};
    return dl(r, out, f, 2);
}

/* -- a session under test --------------------------------------------------------- */

typedef struct T {
    fb_resp_session *r;
    fb_zbuf out;
    msg m;          /* the last message taken */
    size_t used;    /* the last input's */
} T;

/* A session whose HELLO went and was welcomed. */
static void t_open(T *t, uint64_t max_request, int auth)
{
    memset(t, 0, sizeof *t);
    t->r = fb_resp_session_new(max_request, auth);
    REQUIRE(t->r);
    size_t used = 1;
    REQUIRE(fb_resp_session_input(t->r, U(""), 0, &used, &t->out) == FB_RESP_MESSAGE);
    take(t->r, &t->m);
    REQUIRE(frame_is(&t->m, 0, "H"));
    REQUIRE(fb_resp_session_input(t->r, U(""), 0, &used, &t->out) == FB_RESP_WAIT);
    REQUIRE(d_welcome(t->r, &t->out) == FB_RESP_RESUME);
    REQUIRE(zlen(&t->out) == 0);
}

static void t_close(T *t)
{
    fb_resp_session_free(t->r);
    fb_zbuf_free(&t->out);
    msg_free(&t->m);
    memset(t, 0, sizeof *t);
}

/* Bytes in (a copy of exactly n bytes, so that reading past them is
 * AddressSanitizer's error): the result; a message is taken into t->m. */
static int t_in(T *t, const void *p, size_t n)
{
    unsigned char *c = malloc(n ? n : 1);
    REQUIRE(c);
    memcpy(c, p, n);
    t->used = (size_t)-1;
    int rc = fb_resp_session_input(t->r, c, n, &t->used, &t->out);
    free(c);
    REQUIRE(t->used <= n);
    if (rc == FB_RESP_MESSAGE) take(t->r, &t->m);
    return rc;
}

/* One request (its words); all of it is taken, unless the session waits. */
static int t_req_(T *t, const char *words, const char *file, int line)
{
    fb_zbuf b = {0};
    cmd_words(&b, words);
    int rc = t_in(t, zdata(&b), zlen(&b));
    if (rc != FB_RESP_WAIT && t->used != zlen(&b)) ctest_fail_eq(file, line, "used", (long long)t->used, "len", (long long)zlen(&b));
    fb_zbuf_free(&b);
    return rc;
}
#define REQ(t, words) t_req_((t), (words), __FILE__, __LINE__)

static int t_raw(T *t, const char *s) { return t_in(t, s, strlen(s)); }

/* SUBSCRIBE-like words, confirmed: its replies left in out. */
static uint64_t t_subscribe_(T *t, const char *words, const char *ops, const char *file, int line)
{
    int rc = t_req_(t, words, file, line);
    if (rc != FB_RESP_MESSAGE) {
        ctest_fail_eq(file, line, "rc", rc, "FB_RESP_MESSAGE", FB_RESP_MESSAGE);
        return 0;
    }
    uint64_t seq = check_sub_(&t->m, ops, file, line);
    if (t_in(t, "", 0) != FB_RESP_WAIT) ctest_fail(file, line, "not waiting for CONFIRM");
    if (d_confirm(t->r, &t->out, seq) != FB_RESP_RESUME) ctest_fail(file, line, "CONFIRM did not resume");
    return seq;
}
#define SUBSCRIBE(t, words, ops) t_subscribe_((t), (words), (ops), __FILE__, __LINE__)

/* -- the tests -------------------------------------------------------------------- */

static void test_hello_first(void)
{
    T t;
    memset(&t, 0, sizeof t);
    t.r = fb_resp_session_new(0, 0);
    REQUIRE(t.r);
    CHECK(fb_resp_session_pending(t.r));
    /* The HELLO comes first, whatever was sent; nothing is parsed. */
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_MESSAGE);
    CHECK_EQ(t.used, 0);
    CHECK_EQ(t.m.n, 2);
    CHECK(frame_is(&t.m, 0, "H"));
    CHECK(has(t.m.f[1], t.m.len[1], "\"v\": 1"));
    CHECK(has(t.m.f[1], t.m.len[1], "\"role\": \"redis\""));
    CHECK(has(t.m.f[1], t.m.len[1], "\"pub\": false"));
    CHECK(!fb_resp_session_pending(t.r));
    CHECK_EQ(zlen(&t.out), 0);
    /* Until the WELCOME: wait, take nothing. */
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_WAIT);
        CHECK_EQ(t.used, 0);
    }
    /* What is not a WELCOME does not end the wait. */
    CHECK_EQ(d_confirm(t.r, &t.out, 1), 0);
    CHECK_EQ(d_reply(t.r, &t.out, "+OK\r\n", 0), 0);
    CHECK_EQ(d_data(t.r, &t.out, 0, 1, "a", "x"), 0);
    fb_resp_frame bogus[1] = {{U("hh"), 2}};
    CHECK_EQ(dl(t.r, &t.out, bogus, 1), 0);
    CHECK_EQ(dl(t.r, &t.out, bogus, 0), 0);
    CHECK_EQ(zlen(&t.out), 0);
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_WAIT);
    CHECK_EQ(d_welcome(t.r, &t.out), FB_RESP_RESUME);
    CHECK_EQ(d_welcome(t.r, &t.out), 0);       /* (a second one: nothing) */
    CHECK_EQ(zlen(&t.out), 0);
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_MORE);
    CHECK_EQ(t.used, 6);
    OUT(&t.out, "+PONG\r\n");
    fb_resp_session_stats st;
    fb_resp_session_get_stats(t.r, &st);
    CHECK_EQ(st.requests, 1);
    t_close(&t);
    fb_resp_session_free(NULL);
}

static void test_ping_echo_quit_resp2(void)
{
    T t;
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "PING"), FB_RESP_MORE);
    OUT(&t.out, "+PONG\r\n");
    CHECK_EQ(REQ(&t, "ping hello"), FB_RESP_MORE);
    OUT(&t.out, "$5\r\nhello\r\n");
    CHECK_EQ(REQ(&t, "PiNg"), FB_RESP_MORE);
    OUT(&t.out, "+PONG\r\n");
    CHECK_EQ(REQ(&t, "PING a b"), FB_RESP_MORE);
    OUT(&t.out, "-ERR wrong number of arguments for 'ping' command\r\n");
    CHECK_EQ(REQ(&t, "ECHO hi"), FB_RESP_MORE);
    OUT(&t.out, "$2\r\nhi\r\n");
    CHECK_EQ(REQ(&t, "echo"), FB_RESP_MORE);
    OUT(&t.out, "-ERR wrong number of arguments for 'echo' command\r\n");
    CHECK_EQ(REQ(&t, "ECHO a b"), FB_RESP_MORE);
    OUT(&t.out, "-ERR wrong number of arguments for 'echo' command\r\n");
    /* Binary arguments, CRLF and NUL inside, and an empty one. */
    fb_zbuf b = {0};
    const char *w[2] = {"ECHO", "a\r\n\0b"};
    size_t wn[2] = {4, 5};
    cmd_argv(&b, 2, w, wn);
    wn[1] = 0;
    cmd_argv(&b, 2, w, wn);
    CHECK_EQ(t_in(&t, zdata(&b), zlen(&b)), FB_RESP_MORE);
    CHECK_EQ(t.used, zlen(&b));
    OUT(&t.out, "$5\r\na\r\n\0b\r\n$0\r\n\r\n");
    fb_zbuf_free(&b);
    /* A pipeline: every reply, in order, one call. */
    CHECK_EQ(t_raw(&t, "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n*2\r\n$4\r\nPING\r\n$1\r\ny\r\n"),
             FB_RESP_MORE);
    OUT(&t.out, "+PONG\r\n$1\r\nx\r\n$1\r\ny\r\n");
    /* QUIT: +OK and close; nothing after it is read. */
    CHECK_EQ(t_raw(&t, "QUIT\r\nPING\r\n"), FB_RESP_CLOSE);
    CHECK_EQ(t.used, 6);
    OUT(&t.out, "+OK\r\n");
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_CLOSE);
    CHECK_EQ(t.used, 0);
    CHECK_EQ(zlen(&t.out), 0);
    fb_resp_session_stats st;
    fb_resp_session_get_stats(t.r, &st);
    CHECK_EQ(st.requests, 13);
    t_close(&t);

    /* QUIT with arguments is still QUIT (as Redis). */
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "quit now"), FB_RESP_CLOSE);
    OUT(&t.out, "+OK\r\n");
    t_close(&t);
}

/* Commands the Python side answers: [r, state, request] and back. */
static void test_python_replies_and_resp3(void)
{
    T t;
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "CLIENT SETNAME foo"), FB_RESP_MESSAGE);
    CHECK_EQ(t.m.n, 3);
    CHECK(frame_is(&t.m, 0, "r"));
    CHECK_EQ(t.m.len[1], 1);
    CHECK_EQ(t.m.f[1][0], FB_RESP_STATE_AUTHED);      /* no password needed: authed, RESP2, no subscription */
    CHECK(frame_is(&t.m, 2, "*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$3\r\nfoo\r\n"));
    /* Until its answer, nothing is parsed. */
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_WAIT);
    CHECK_EQ(t.used, 0);
    CHECK_EQ(d_welcome(t.r, &t.out), 0);
    CHECK_EQ(d_confirm(t.r, &t.out, 99), 0);
    CHECK_EQ(zlen(&t.out), 0);
    CHECK_EQ(d_reply(t.r, &t.out, "+OK\r\n", FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    OUT(&t.out, "+OK\r\n");
    CHECK_EQ(d_reply(t.r, &t.out, "+LATE\r\n", 0), 0);  /* none asked for: nothing */
    CHECK_EQ(zlen(&t.out), 0);
    /* An answer without a state frame keeps the state. */
    CHECK_EQ(REQ(&t, "INFO"), FB_RESP_MESSAGE);
    CHECK(frame_is(&t.m, 2, "*1\r\n$4\r\nINFO\r\n"));
    CHECK_EQ(d_reply(t.r, &t.out, "$0\r\n\r\n", -1), FB_RESP_RESUME);
    OUT(&t.out, "$0\r\n\r\n");
    /* An unknown command goes there too (its error is written there). */
    CHECK_EQ(REQ(&t, "FLUSHALL"), FB_RESP_MESSAGE);
    CHECK(frame_is(&t.m, 2, "*1\r\n$8\r\nFLUSHALL\r\n"));
    CHECK_EQ(d_reply(t.r, &t.out, "-ERR unknown command 'FLUSHALL'\r\n", FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    OUT(&t.out, "-ERR unknown command 'FLUSHALL'\r\n");

    /* HELLO 3: the answer's state says RESP3. */
    CHECK_EQ(REQ(&t, "HELLO 3"), FB_RESP_MESSAGE);
    CHECK(frame_is(&t.m, 2, "*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n"));
    CHECK_EQ(t_in(&t, "", 0), FB_RESP_WAIT);
    CHECK_EQ(d_reply(t.r, &t.out, "%1\r\n+proto\r\n:3\r\n", FB_RESP_STATE_RESP3 | FB_RESP_STATE_AUTHED),
             FB_RESP_RESUME);
    OUT(&t.out, "%1\r\n+proto\r\n:3\r\n");
    CHECK_EQ(REQ(&t, "PING"), FB_RESP_MORE);
    OUT(&t.out, "+PONG\r\n");
    CHECK_EQ(REQ(&t, "PING x"), FB_RESP_MORE);
    OUT(&t.out, "$1\r\nx\r\n");
    CHECK_EQ(REQ(&t, "ECHO e"), FB_RESP_MORE);
    OUT(&t.out, "$1\r\ne\r\n");
    /* RESP3: pushes, null as "_", and no subscribed mode. */
    SUBSCRIBE(&t, "SUBSCRIBE a", "a:1");
    OUT(&t.out, ">3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n");
    CHECK_EQ(REQ(&t, "PING"), FB_RESP_MORE);
    OUT(&t.out, "+PONG\r\n");
    CHECK_EQ(REQ(&t, "ECHO e"), FB_RESP_MORE);
    OUT(&t.out, "$1\r\ne\r\n");
    CHECK_EQ(d_data(t.r, &t.out, 1, 1, "a", "m"), 0);
    OUT(&t.out, ">3\r\n$7\r\nmessage\r\n$1\r\na\r\n$1\r\nm\r\n");
    CHECK_EQ(REQ(&t, "PUBLISH a z"), FB_RESP_MESSAGE);  /* allowed while subscribed in RESP3 */
    CHECK(frame_is(&t.m, 0, "P"));
    fb_resp_session_routed(t.r, 1, 0, &t.out);
    OUT(&t.out, ":1\r\n");
    CHECK_EQ(REQ(&t, "CLIENT ID"), FB_RESP_MESSAGE);
    CHECK_EQ(t.m.f[1][0], FB_RESP_STATE_RESP3 | FB_RESP_STATE_AUTHED | FB_RESP_STATE_SUBSCRIBED);
    CHECK_EQ(d_reply(t.r, &t.out, ":7\r\n", FB_RESP_STATE_RESP3 | FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    OUT(&t.out, ":7\r\n");
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE nope"), FB_RESP_MORE);
    OUT(&t.out, ">3\r\n$11\r\nunsubscribe\r\n$4\r\nnope\r\n:1\r\n");
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE"), FB_RESP_MESSAGE);
    OUT(&t.out, ">3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:0\r\n");
    CHECK_SUB(&t.m, "a:0");
    CHECK_EQ(REQ(&t, "PUNSUBSCRIBE"), FB_RESP_MORE);
    OUT(&t.out, ">3\r\n$12\r\npunsubscribe\r\n_\r\n:0\r\n");
    /* HELLO 2: back to RESP2. */
    CHECK_EQ(REQ(&t, "HELLO 2"), FB_RESP_MESSAGE);
    CHECK_EQ(d_reply(t.r, &t.out, "*0\r\n", FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    OUT(&t.out, "*0\r\n");
    CHECK_EQ(REQ(&t, "PUNSUBSCRIBE"), FB_RESP_MORE);
    OUT(&t.out, "*3\r\n$12\r\npunsubscribe\r\n$-1\r\n:0\r\n");
    /* QUIT in RESP3 is the same +OK. */
    CHECK_EQ(REQ(&t, "HELLO 3"), FB_RESP_MESSAGE);
    CHECK_EQ(d_reply(t.r, &t.out, "%0\r\n", FB_RESP_STATE_RESP3 | FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    OUT(&t.out, "%0\r\n");
    CHECK_EQ(REQ(&t, "QUIT"), FB_RESP_CLOSE);
    OUT(&t.out, "+OK\r\n");
    t_close(&t);

    /* An answer that closes: written, then FB_RESP_CLOSE. */
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "SHUTDOWN"), FB_RESP_MESSAGE);
    CHECK_EQ(d_reply(t.r, &t.out, "-ERR bye\r\n", FB_RESP_STATE_CLOSE | FB_RESP_STATE_AUTHED), FB_RESP_CLOSE);
    OUT(&t.out, "-ERR bye\r\n");
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_CLOSE);
    CHECK_EQ(t.used, 0);
    t_close(&t);

    /* KICK (a slow consumer): close. */
    t_open(&t, 0, 0);
    CHECK_EQ(d_kick(t.r, &t.out), FB_RESP_CLOSE);
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_CLOSE);
    CHECK_EQ(zlen(&t.out), 0);
    t_close(&t);
}

static void test_publish(void)
{
    T t;
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "PUBLISH news hello"), FB_RESP_MESSAGE);
    CHECK_EQ(t.m.n, 2);
    CHECK(frame_is(&t.m, 0, "P"));
    fb_record recs[4];
    CHECK_EQ(decode(&t.m, 1, recs, 4), 1);
    CHECK(rec_is(&recs[0], "news", "hello", 5));
    CHECK(!fb_resp_session_pending(t.r));
    CHECK_EQ(zlen(&t.out), 0);                    /* the reply is the router's count */
    fb_resp_session_routed(t.r, 3, 0, &t.out);
    OUT(&t.out, ":3\r\n");
    fb_resp_session_routed(t.r, 4, 0, &t.out);    /* no PUB waiting: nothing */
    CHECK_EQ(zlen(&t.out), 0);

    /* Binary payload, empty channel; SPUBLISH the same. */
    fb_zbuf b = {0};
    const char *w[3] = {"spublish", "", "\0\r\n\xff"};
    size_t wn[3] = {8, 0, 4};
    cmd_argv(&b, 3, w, wn);
    CHECK_EQ(t_in(&t, zdata(&b), zlen(&b)), FB_RESP_MESSAGE);
    CHECK_EQ(t.used, zlen(&b));
    fb_zbuf_free(&b);
    CHECK(frame_is(&t.m, 0, "P"));
    CHECK_EQ(decode(&t.m, 1, recs, 4), 1);
    CHECK(rec_is(&recs[0], "", "\0\r\n\xff", 4));
    fb_resp_session_routed(t.r, 0, 0, &t.out);
    OUT(&t.out, ":0\r\n");

    /* Over the broker's limits: an error. */
    CHECK_EQ(REQ(&t, "PUBLISH big x"), FB_RESP_MESSAGE);
    fb_resp_session_routed(t.r, 0, 1, &t.out);
    OUT(&t.out, "-ERR message over the broker's --max-payload or --max-topic: not published\r\n");
    /* A count past INT64_MAX is clipped. */
    CHECK_EQ(REQ(&t, "PUBLISH c x"), FB_RESP_MESSAGE);
    fb_resp_session_routed(t.r, UINT64_MAX, 0, &t.out);
    OUT(&t.out, ":9223372036854775807\r\n");
    /* No count came back before the next input: ":0" first. */
    CHECK_EQ(REQ(&t, "PUBLISH c x"), FB_RESP_MESSAGE);
    CHECK_EQ(REQ(&t, "PING"), FB_RESP_MORE);
    OUT(&t.out, ":0\r\n+PONG\r\n");
    fb_resp_session_routed(t.r, 5, 0, &t.out);
    CHECK_EQ(zlen(&t.out), 0);
    /* Wrong arguments. */
    CHECK_EQ(REQ(&t, "PUBLISH c"), FB_RESP_MORE);
    OUT(&t.out, "-ERR wrong number of arguments for 'publish' command\r\n");
    CHECK_EQ(REQ(&t, "PUBLISH c x y"), FB_RESP_MORE);
    OUT(&t.out, "-ERR wrong number of arguments for 'publish' command\r\n");
    /* A pipeline: one PUB a call, the rest waiting its turn. */
    const char *pl = "*3\r\n$7\r\nPUBLISH\r\n$1\r\na\r\n$1\r\n1\r\n*3\r\n$7\r\nPUBLISH\r\n$1\r\nb\r\n$1\r\n2\r\nPING\r\n";
    size_t first = strlen("*3\r\n$7\r\nPUBLISH\r\n$1\r\na\r\n$1\r\n1\r\n");
    CHECK_EQ(t_raw(&t, pl), FB_RESP_MESSAGE);
    CHECK_EQ(t.used, first);
    CHECK_EQ(decode(&t.m, 1, recs, 4), 1);
    CHECK(rec_is(&recs[0], "a", "1", 1));
    fb_resp_session_routed(t.r, 1, 0, &t.out);
    CHECK_EQ(t_raw(&t, pl + first), FB_RESP_MESSAGE);
    CHECK_EQ(t.used, first);
    CHECK_EQ(decode(&t.m, 1, recs, 4), 1);
    CHECK(rec_is(&recs[0], "b", "2", 1));
    fb_resp_session_routed(t.r, 2, 0, &t.out);
    CHECK_EQ(t_raw(&t, pl + 2 * first), FB_RESP_MORE);
    OUT(&t.out, ":1\r\n:2\r\n+PONG\r\n");
    fb_resp_session_stats st;
    fb_resp_session_get_stats(t.r, &st);
    CHECK_EQ(st.published, 7);
    t_close(&t);
}

static void test_subscribe_confirm(void)
{
    T t;
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "SUBSCRIBE a b"), FB_RESP_MESSAGE);
    uint64_t seq = CHECK_SUB(&t.m, "a:1 b:1");
    CHECK(seq != 0);
    CHECK_EQ(zlen(&t.out), 0);
    /* Waits for its CONFIRM: the next request is not parsed. */
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_WAIT);
    CHECK_EQ(t.used, 0);
    CHECK_EQ(d_confirm(t.r, &t.out, seq - 1), 0);  /* an earlier one's: not it */
    CHECK_EQ(d_welcome(t.r, &t.out), 0);
    CHECK_EQ(d_reply(t.r, &t.out, "+X\r\n", 0), 0);
    CHECK_EQ(zlen(&t.out), 0);
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_WAIT);
    CHECK_EQ(d_confirm(t.r, &t.out, seq), FB_RESP_RESUME);
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n");
    CHECK_EQ(d_confirm(t.r, &t.out, seq), 0);      /* again: nothing */
    CHECK_EQ(zlen(&t.out), 0);
    /* Subscribed (RESP2): PING's answer is an array. */
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_MORE);
    OUT(&t.out, "*2\r\n$4\r\npong\r\n$0\r\n\r\n");
    CHECK_EQ(REQ(&t, "PING hey"), FB_RESP_MORE);
    OUT(&t.out, "*2\r\n$4\r\npong\r\n$3\r\nhey\r\n");
    /* One held, one new: only the new one goes to the broker; the count
     * stays for the held one. */
    uint64_t seq2 = SUBSCRIBE(&t, "subscribe a c", "c:1");
    CHECK(seq2 > seq);
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:2\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:3\r\n");
    /* All held: the replies at once, no message. */
    CHECK_EQ(REQ(&t, "SUBSCRIBE b a"), FB_RESP_MORE);
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:3\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:3\r\n");
    CHECK(!fb_resp_session_pending(t.r));
    /* A key twice in one command: one op, counted once. */
    SUBSCRIBE(&t, "SUBSCRIBE d d", "d:1");
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\nd\r\n:4\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nd\r\n:4\r\n");
    CHECK_EQ(REQ(&t, "SUBSCRIBE"), FB_RESP_MORE);
    OUT(&t.out, "-ERR wrong number of arguments for 'subscribe' command\r\n");
    /* A pipeline: the SUB, then (after CONFIRM) the rest. */
    CHECK_EQ(t_raw(&t, "SUBSCRIBE e\r\nPING\r\n"), FB_RESP_MESSAGE);
    CHECK_EQ(t.used, 13);
    uint64_t s3 = CHECK_SUB(&t.m, "e:1");
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_WAIT);
    CHECK_EQ(d_confirm(t.r, &t.out, s3 + 1), FB_RESP_RESUME);   /* a later seq covers it */
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_MORE);
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\ne\r\n:5\r\n*2\r\n$4\r\npong\r\n$0\r\n\r\n");
    t_close(&t);
}

static void test_data_held_until_confirm(void)
{
    T t;
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "SUBSCRIBE a b"), FB_RESP_MESSAGE);
    uint64_t seq = CHECK_SUB(&t.m, "a:1 b:1");
    CHECK_EQ(d_data(t.r, &t.out, seq, 1, "a", "early1"), 0);
    CHECK_EQ(d_data(t.r, &t.out, seq, 2, "b", "early2", "x", "not mine"), 0);
    CHECK_EQ(zlen(&t.out), 0);                      /* held */
    CHECK_EQ(t_in(&t, "", 0), FB_RESP_WAIT);
    CHECK_EQ(d_confirm(t.r, &t.out, seq), FB_RESP_RESUME);
    fb_zbuf e = {0};
    e_sub(&e, 0, "subscribe", "a", 1);
    e_sub(&e, 0, "subscribe", "b", 2);
    e_msg(&e, 0, "message", "a", "early1");
    e_msg(&e, 0, "message", "b", "early2");
    OUTZ(&t.out, &e);
    zclear(&e);
    /* Afterwards: at once. */
    CHECK_EQ(d_data(t.r, &t.out, seq, 1, "b", "now"), 0);
    e_msg(&e, 0, "message", "b", "now");
    OUTZ(&t.out, &e);
    zclear(&e);
    /* A second subscribe holds data for the held keys as well, and keeps
     * its order. */
    CHECK_EQ(REQ(&t, "SUBSCRIBE c"), FB_RESP_MESSAGE);
    uint64_t s2 = CHECK_SUB(&t.m, "c:1");
    CHECK_EQ(d_data(t.r, &t.out, seq, 1, "a", "1"), 0);
    CHECK_EQ(d_data(t.r, &t.out, s2, 2, "c", "2", "a", "3"), 0);
    CHECK_EQ(zlen(&t.out), 0);
    CHECK_EQ(d_confirm(t.r, &t.out, s2), FB_RESP_RESUME);
    e_sub(&e, 0, "subscribe", "c", 3);
    e_msg(&e, 0, "message", "a", "1");
    e_msg(&e, 0, "message", "c", "2");
    e_msg(&e, 0, "message", "a", "3");
    OUTZ(&t.out, &e);
    fb_resp_session_stats st;
    fb_resp_session_get_stats(t.r, &st);
    CHECK_EQ(st.delivered, 6);
    fb_zbuf_free(&e);
    t_close(&t);
}

static void test_message_kinds(void)
{
    T t;
    t_open(&t, 0, 0);
    fb_zbuf e = {0};
    SUBSCRIBE(&t, "SUBSCRIBE ch", "ch:1");
    CHECK_EQ(zlen(&t.out) > 0, 1);
    zclear(&t.out);
    SUBSCRIBE(&t, "PSUBSCRIBE n* h?llo", "n*:5 h?llo:5");
    e_sub(&e, 0, "psubscribe", "n*", 2);
    e_sub(&e, 0, "psubscribe", "h?llo", 3);
    OUTZ(&t.out, &e);
    zclear(&e);
    SUBSCRIBE(&t, "SSUBSCRIBE sh", "sh:1");
    e_sub(&e, 0, "ssubscribe", "sh", 1);            /* shard channels count apart */
    OUTZ(&t.out, &e);
    zclear(&e);
    /* A pattern already held: no SUB. */
    CHECK_EQ(REQ(&t, "PSUBSCRIBE n*"), FB_RESP_MORE);
    e_sub(&e, 0, "psubscribe", "n*", 3);
    OUTZ(&t.out, &e);
    zclear(&e);

    CHECK_EQ(d_data(t.r, &t.out, 3, 5, "ch", "1", "news", "2", "hello", "3", "sh", "4", "other", "5"), 0);
    e_msg(&e, 0, "message", "ch", "1");
    e_pmsg(&e, 0, "n*", "news", "2");
    e_pmsg(&e, 0, "h?llo", "hello", "3");
    e_msg(&e, 0, "smessage", "sh", "4");
    OUTZ(&t.out, &e);
    zclear(&e);

    /* A record two patterns and a channel match: the message, then each
     * pattern's. */
    SUBSCRIBE(&t, "PSUBSCRIBE *", "*:5");
    zclear(&t.out);
    SUBSCRIBE(&t, "SUBSCRIBE news", "news:1");
    zclear(&t.out);
    CHECK_EQ(d_data(t.r, &t.out, 5, 1, "news", "x"), 0);
    e_msg(&e, 0, "message", "news", "x");
    e_pmsg(&e, 0, "n*", "news", "x");
    e_pmsg(&e, 0, "*", "news", "x");
    OUTZ(&t.out, &e);
    zclear(&e);

    /* A key both a channel and a shard channel: the broker already has it,
     * so no SUB either way; both kinds delivered. */
    CHECK_EQ(REQ(&t, "SSUBSCRIBE ch"), FB_RESP_MORE);
    e_sub(&e, 0, "ssubscribe", "ch", 2);
    OUTZ(&t.out, &e);
    zclear(&e);
    CHECK_EQ(REQ(&t, "PUNSUBSCRIBE *"), FB_RESP_MESSAGE);
    CHECK_SUB(&t.m, "*:4");
    e_sub(&e, 0, "punsubscribe", "*", 4);
    OUTZ(&t.out, &e);
    zclear(&e);
    CHECK_EQ(d_data(t.r, &t.out, 6, 1, "ch", "y"), 0);
    e_msg(&e, 0, "message", "ch", "y");
    e_msg(&e, 0, "smessage", "ch", "y");
    OUTZ(&t.out, &e);
    zclear(&e);
    CHECK_EQ(REQ(&t, "SUNSUBSCRIBE ch"), FB_RESP_MORE);   /* still a channel: no SUB */
    e_sub(&e, 0, "sunsubscribe", "ch", 1);
    OUTZ(&t.out, &e);
    zclear(&e);
    CHECK(!fb_resp_session_pending(t.r));
    CHECK_EQ(d_data(t.r, &t.out, 6, 1, "ch", "z"), 0);
    e_msg(&e, 0, "message", "ch", "z");
    OUTZ(&t.out, &e);
    zclear(&e);
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE ch"), FB_RESP_MESSAGE);  /* the last hold: now the broker is told */
    CHECK_SUB(&t.m, "ch:0");
    e_sub(&e, 0, "unsubscribe", "ch", 3);
    OUTZ(&t.out, &e);
    zclear(&e);
    CHECK_EQ(d_data(t.r, &t.out, 7, 1, "ch", "gone"), 0);
    CHECK_EQ(zlen(&t.out), 0);
    /* Glob syntax: a class and an escape. */
    SUBSCRIBE(&t, "PSUBSCRIBE [ab]x\\*", "[ab]x\\*:5");
    zclear(&t.out);
    CHECK_EQ(d_data(t.r, &t.out, 8, 3, "bx*", "1", "cx*", "2", "axy", "3"), 0);
    e_pmsg(&e, 0, "[ab]x\\*", "bx*", "1");
    OUTZ(&t.out, &e);
    zclear(&e);
    /* A batch that is not one: ignored. */
    fb_resp_frame bad[3] = {{U("D"), 1}, {U("\0\0\0\0\0\0\0\0"), 8}, {U("FB\x01\x00\x05\0\0\0"), 8}};
    CHECK_EQ(dl(t.r, &t.out, bad, 3), 0);
    CHECK_EQ(dl(t.r, &t.out, bad, 2), 0);
    CHECK_EQ(zlen(&t.out), 0);
    /* GAP: counted. */
    unsigned char lost[8];
    put64(lost, 42);
    fb_resp_frame gap[2] = {{U("G"), 1}, {lost, 8}};
    CHECK_EQ(dl(t.r, &t.out, gap, 2), 0);
    CHECK_EQ(zlen(&t.out), 0);
    fb_resp_session_stats st;
    fb_resp_session_get_stats(t.r, &st);
    CHECK_EQ(st.gaps_lost, 42);
    CHECK_EQ(st.delivered, 11);
    fb_zbuf_free(&e);
    t_close(&t);
}

static void test_message_kinds_resp3(void)
{
    T t;
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "HELLO 3"), FB_RESP_MESSAGE);
    CHECK_EQ(d_reply(t.r, &t.out, "%0\r\n", FB_RESP_STATE_RESP3 | FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    zclear(&t.out);
    fb_zbuf e = {0};
    SUBSCRIBE(&t, "SUBSCRIBE c", "c:1");
    SUBSCRIBE(&t, "PSUBSCRIBE c*", "c*:5");
    SUBSCRIBE(&t, "SSUBSCRIBE s", "s:1");
    e_sub(&e, 1, "subscribe", "c", 1);
    e_sub(&e, 1, "psubscribe", "c*", 2);
    e_sub(&e, 1, "ssubscribe", "s", 1);
    OUTZ(&t.out, &e);
    zclear(&e);
    CHECK_EQ(d_data(t.r, &t.out, 3, 2, "c", "1", "s", "2"), 0);
    e_msg(&e, 1, "message", "c", "1");
    e_pmsg(&e, 1, "c*", "c", "1");
    e_msg(&e, 1, "smessage", "s", "2");
    OUTZ(&t.out, &e);
    fb_zbuf_free(&e);
    t_close(&t);
}

static void test_unsubscribe(void)
{
    T t;
    t_open(&t, 0, 0);
    fb_zbuf e = {0};
    SUBSCRIBE(&t, "SUBSCRIBE a b c", "a:1 b:1 c:1");
    zclear(&t.out);
    /* The reply at once; the SUB goes, but nothing waits for it. */
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE b"), FB_RESP_MESSAGE);
    OUT(&t.out, "*3\r\n$11\r\nunsubscribe\r\n$1\r\nb\r\n:2\r\n");
    uint64_t us = CHECK_SUB(&t.m, "b:0");
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_MORE);
    OUT(&t.out, "*2\r\n$4\r\npong\r\n$0\r\n\r\n");
    /* Data on its way for b is not delivered; a's is. */
    CHECK_EQ(d_data(t.r, &t.out, us - 1, 2, "b", "late", "a", "ok"), 0);
    OUT(&t.out, "*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$2\r\nok\r\n");
    CHECK_EQ(d_confirm(t.r, &t.out, us), 0);        /* its CONFIRM: nothing */
    CHECK_EQ(zlen(&t.out), 0);
    /* Not subscribed: the reply only. */
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE zz"), FB_RESP_MORE);
    OUT(&t.out, "*3\r\n$11\r\nunsubscribe\r\n$2\r\nzz\r\n:2\r\n");
    /* Several at once: one SUB. */
    SUBSCRIBE(&t, "SUBSCRIBE d e", "d:1 e:1");
    zclear(&t.out);
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE d zz e"), FB_RESP_MESSAGE);
    CHECK_SUB(&t.m, "d:0 e:0");
    OUT(&t.out, "*3\r\n$11\r\nunsubscribe\r\n$1\r\nd\r\n:3\r\n*3\r\n$11\r\nunsubscribe\r\n$2\r\nzz\r\n:3\r\n"
                "*3\r\n$11\r\nunsubscribe\r\n$1\r\ne\r\n:2\r\n");
    /* All: a reply for each (in some order), counting down. */
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE"), FB_RESP_MESSAGE);
    fb_record recs[8];
    size_t n;
    sub_of(&t.m, recs, 8, &n);
    CHECK_EQ(n, 2);
    CHECK_EQ(count_of(zdata(&t.out), zlen(&t.out), "$11\r\nunsubscribe\r\n"), 2);
    CHECK(has(zdata(&t.out), zlen(&t.out), "\r\n:1\r\n"));
    CHECK(has(zdata(&t.out), zlen(&t.out), "\r\n:0\r\n"));
    CHECK(has(zdata(&t.out), zlen(&t.out), "$1\r\na\r\n"));
    CHECK(has(zdata(&t.out), zlen(&t.out), "$1\r\nc\r\n"));
    zclear(&t.out);
    CHECK_EQ(d_data(t.r, &t.out, 9, 2, "a", "1", "c", "2"), 0);
    CHECK_EQ(zlen(&t.out), 0);
    /* None left. */
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE"), FB_RESP_MORE);
    OUT(&t.out, "*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n");
    CHECK_EQ(REQ(&t, "SUNSUBSCRIBE"), FB_RESP_MORE);
    OUT(&t.out, "*3\r\n$12\r\nsunsubscribe\r\n$-1\r\n:0\r\n");
    /* Not subscribed any more: PUBLISH and ECHO work again. */
    CHECK_EQ(REQ(&t, "ECHO x"), FB_RESP_MORE);
    OUT(&t.out, "$1\r\nx\r\n");
    CHECK_EQ(REQ(&t, "PUBLISH a 1"), FB_RESP_MESSAGE);
    fb_resp_session_routed(t.r, 0, 0, &t.out);
    OUT(&t.out, ":0\r\n");
    /* Patterns: PUNSUBSCRIBE p, then all. */
    SUBSCRIBE(&t, "PSUBSCRIBE p* q*", "p*:5 q*:5");
    zclear(&t.out);
    CHECK_EQ(REQ(&t, "PUNSUBSCRIBE p*"), FB_RESP_MESSAGE);
    CHECK_SUB(&t.m, "p*:4");
    OUT(&t.out, "*3\r\n$12\r\npunsubscribe\r\n$2\r\np*\r\n:1\r\n");
    CHECK_EQ(d_data(t.r, &t.out, 9, 2, "px", "1", "qx", "2"), 0);
    e_pmsg(&e, 0, "q*", "qx", "2");
    OUTZ(&t.out, &e);
    CHECK_EQ(REQ(&t, "PUNSUBSCRIBE"), FB_RESP_MESSAGE);
    CHECK_SUB(&t.m, "q*:4");
    OUT(&t.out, "*3\r\n$12\r\npunsubscribe\r\n$2\r\nq*\r\n:0\r\n");
    /* UNSUBSCRIBE (all) leaves patterns and shard channels. */
    SUBSCRIBE(&t, "PSUBSCRIBE x*", "x*:5");
    SUBSCRIBE(&t, "SSUBSCRIBE s", "s:1");
    SUBSCRIBE(&t, "SUBSCRIBE k", "k:1");
    zclear(&t.out);
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE"), FB_RESP_MESSAGE);
    CHECK_SUB(&t.m, "k:0");
    OUT(&t.out, "*3\r\n$11\r\nunsubscribe\r\n$1\r\nk\r\n:1\r\n");
    CHECK_EQ(REQ(&t, "SUNSUBSCRIBE"), FB_RESP_MESSAGE);
    CHECK_SUB(&t.m, "s:0");
    OUT(&t.out, "*3\r\n$12\r\nsunsubscribe\r\n$1\r\ns\r\n:0\r\n");
    /* RESET: every key goes, RESP2, not subscribed. */
    SUBSCRIBE(&t, "SUBSCRIBE r1", "r1:1");
    zclear(&t.out);
    CHECK_EQ(REQ(&t, "RESET"), FB_RESP_MESSAGE);
    OUT(&t.out, "+RESET\r\n");
    fb_record rr[8];
    sub_of(&t.m, rr, 8, &n);
    CHECK_EQ(n, 2);                                 /* x* (a glob) and r1 */
    int glob = 0, ch = 0;
    for (size_t i = 0; i < n; i++) {
        if (rec_is(&rr[i], "x*", "\x04", 1)) glob++;
        if (rec_is(&rr[i], "r1", "\0", 1)) ch++;
    }
    CHECK(glob == 1 && ch == 1);
    CHECK_EQ(REQ(&t, "ECHO ok"), FB_RESP_MORE);
    OUT(&t.out, "$2\r\nok\r\n");
    CHECK_EQ(REQ(&t, "RESET"), FB_RESP_MORE);       /* nothing held: no SUB */
    OUT(&t.out, "+RESET\r\n");
    fb_zbuf_free(&e);
    t_close(&t);
}

static void test_refused(void)
{
    T t;
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "SUBSCRIBE a b"), FB_RESP_MESSAGE);
    uint64_t seq = CHECK_SUB(&t.m, "a:1 b:1");
    CHECK_EQ(d_refused(t.r, &t.out, seq, "{\"reason\": \"too many subscriptions\"}", 1, "b", 1), 0);
    CHECK_EQ(zlen(&t.out), 0);
    CHECK_EQ(d_confirm(t.r, &t.out, seq), FB_RESP_RESUME);
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n-ERR subscription refused: too many subscriptions\r\n");
    CHECK_EQ(d_data(t.r, &t.out, seq, 2, "b", "no", "a", "yes"), 0);
    OUT(&t.out, "*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$3\r\nyes\r\n");
    /* b is not held: subscribing again asks the broker again. */
    uint64_t s2 = SUBSCRIBE(&t, "SUBSCRIBE b", "b:1");
    CHECK(s2 > seq);
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n");
    /* A pattern refused, the reason without its JSON (none found). */
    CHECK_EQ(REQ(&t, "PSUBSCRIBE p* q*"), FB_RESP_MESSAGE);
    uint64_t s3 = CHECK_SUB(&t.m, "p*:5 q*:5");
    CHECK_EQ(d_refused(t.r, &t.out, s3, "{}", 1, "p*", 5), 0);
    CHECK_EQ(d_confirm(t.r, &t.out, s3), FB_RESP_RESUME);
    OUT(&t.out, "-ERR subscription refused: \r\n*3\r\n$10\r\npsubscribe\r\n$2\r\nq*\r\n:3\r\n");
    CHECK_EQ(d_data(t.r, &t.out, s3, 1, "px", "1"), 0);
    CHECK_EQ(zlen(&t.out), 0);
    /* Everything refused: errors only, not subscribed to them. */
    CHECK_EQ(REQ(&t, "SSUBSCRIBE s1 s2"), FB_RESP_MESSAGE);
    uint64_t s4 = CHECK_SUB(&t.m, "s1:1 s2:1");
    CHECK_EQ(d_refused(t.r, &t.out, s4, "{\"reason\": \"limit\", \"limit\": 2}", 2, "s1", 1, "s2", 1), 0);
    CHECK_EQ(d_confirm(t.r, &t.out, s4), FB_RESP_RESUME);
    OUT(&t.out, "-ERR subscription refused: limit\r\n-ERR subscription refused: limit\r\n");
    CHECK_EQ(REQ(&t, "SUNSUBSCRIBE"), FB_RESP_MORE);
    OUT(&t.out, "*3\r\n$12\r\nsunsubscribe\r\n$-1\r\n:0\r\n");
    /* A REFUSED cut short, or with a bad batch: ignored. */
    CHECK_EQ(REQ(&t, "SUBSCRIBE z"), FB_RESP_MESSAGE);
    uint64_t s5 = CHECK_SUB(&t.m, "z:1");
    fb_resp_frame shortf[3] = {{U("N"), 1}, {U("\0\0\0\0\0\0\0\0"), 8}, {U("FB"), 2}};
    CHECK_EQ(dl(t.r, &t.out, shortf, 3), 0);
    fb_resp_frame badb[4] = {{U("N"), 1}, {U("\0\0\0\0\0\0\0\0"), 8}, {U("xx"), 2}, {U("{\"reason\": \"x\"}"), 15}};
    CHECK_EQ(dl(t.r, &t.out, badb, 4), 0);
    /* A reason with no closing quote, then one with no opening quote. */
    CHECK_EQ(d_refused(t.r, &t.out, s5, "{\"reason\": \"unterminated", 0), 0);
    CHECK_EQ(d_refused(t.r, &t.out, s5, "{\"reason\": 5}", 0), 0);
    CHECK_EQ(d_confirm(t.r, &t.out, s5), FB_RESP_RESUME);
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\nz\r\n:4\r\n");   /* a, b, z and q* */
    t_close(&t);
}

static void test_subscribed_mode_resp2(void)
{
    T t;
    t_open(&t, 0, 0);
    SUBSCRIBE(&t, "SUBSCRIBE a", "a:1");
    zclear(&t.out);
    static const char suffix[] = "': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n";
    const char *cmds[] = {"PUBLISH a x", "publish a x", "SPUBLISH a x", "ECHO x", "CLIENT LIST", "HELLO 3", "GET k"};
    const char *names[] = {"publish", "publish", "spublish", "echo", "client", "hello", "get"};
    for (int i = 0; i < 7; i++) {
        CHECK_EQ(REQ(&t, cmds[i]), FB_RESP_MORE);
        fb_zbuf e = {0};
        zputs(&e, "-ERR Can't execute '");
        zputs(&e, names[i]);
        zputs(&e, suffix);
        OUTZ(&t.out, &e);
        fb_zbuf_free(&e);
    }
    CHECK(!fb_resp_session_pending(t.r));
    /* Allowed: (un)subscribes, PING, RESET, QUIT. */
    CHECK_EQ(REQ(&t, "PING"), FB_RESP_MORE);
    OUT(&t.out, "*2\r\n$4\r\npong\r\n$0\r\n\r\n");
    SUBSCRIBE(&t, "PSUBSCRIBE x*", "x*:5");
    OUT(&t.out, "*3\r\n$10\r\npsubscribe\r\n$2\r\nx*\r\n:2\r\n");
    CHECK_EQ(REQ(&t, "RESET"), FB_RESP_MESSAGE);
    OUT(&t.out, "+RESET\r\n");
    CHECK_EQ(REQ(&t, "PUBLISH a x"), FB_RESP_MESSAGE);
    fb_resp_session_routed(t.r, 1, 0, &t.out);
    OUT(&t.out, ":1\r\n");
    SUBSCRIBE(&t, "SUBSCRIBE a", "a:1");
    zclear(&t.out);
    CHECK_EQ(REQ(&t, "QUIT"), FB_RESP_CLOSE);
    OUT(&t.out, "+OK\r\n");
    /* A long command name is cut in the error, and odd bytes shown as '?'. */
    t_close(&t);
    t_open(&t, 0, 0);
    SUBSCRIBE(&t, "SUBSCRIBE a", "a:1");
    zclear(&t.out);
    fb_zbuf b = {0};
    const char *w[1] = {"X\x01YYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYYY"};
    cmd_argv(&b, 1, w, NULL);
    CHECK_EQ(t_in(&t, zdata(&b), zlen(&b)), FB_RESP_MORE);
    CHECK(has(zdata(&t.out), zlen(&t.out), "-ERR Can't execute 'x?yyyyyyyyyyyyyyyyyyyyyyyyyyyyyy': only"));
    zclear(&t.out);
    fb_zbuf_free(&b);
    t_close(&t);
}

static void test_many_keys(void)
{
    enum { N = 2500 };
    static char names[N][16];
    static const char *argv[N + 1];
    argv[0] = "SUBSCRIBE";
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "k%d", i);
        argv[i + 1] = names[i];
    }
    T t;
    t_open(&t, 0, 0);
    fb_zbuf b = {0};
    cmd_argv(&b, N + 1, argv, NULL);
    CHECK_EQ(t_in(&t, zdata(&b), zlen(&b)), FB_RESP_MESSAGE);
    CHECK_EQ(t.used, zlen(&b));
    fb_zbuf_free(&b);
    static fb_record recs[N];
    uint64_t seqs[3];
    size_t at = 0, n;
    for (int s = 0; s < 3; s++) {
        if (s) {
            CHECK(fb_resp_session_pending(t.r));
            CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_MESSAGE);   /* the rest first; PING waits */
            CHECK_EQ(t.used, 0);
        }
        seqs[s] = sub_of(&t.m, recs, N, &n);
        CHECK_EQ(n, s < 2 ? 1000 : 500);
        for (size_t i = 0; i < n; i++, at++)
            CHECK(rec_is(&recs[i], names[at], "\x01", 1));
        if (s) CHECK_EQ(seqs[s], seqs[s - 1] + 1);
    }
    CHECK_EQ(at, N);
    CHECK(!fb_resp_session_pending(t.r));
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_WAIT);
    CHECK_EQ(t.used, 0);
    /* Only the last SUB's CONFIRM ends the wait. */
    CHECK_EQ(d_confirm(t.r, &t.out, seqs[0]), 0);
    CHECK_EQ(d_data(t.r, &t.out, seqs[0], 1, "k5", "early"), 0);
    CHECK_EQ(d_confirm(t.r, &t.out, seqs[1]), 0);
    CHECK_EQ(zlen(&t.out), 0);
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_WAIT);
    CHECK_EQ(d_confirm(t.r, &t.out, seqs[2]), FB_RESP_RESUME);
    fb_zbuf e = {0};
    for (int i = 0; i < N; i++) e_sub(&e, 0, "subscribe", names[i], i + 1);
    e_msg(&e, 0, "message", "k5", "early");
    OUTZ(&t.out, &e);
    zclear(&e);
    CHECK_EQ(d_data(t.r, &t.out, seqs[2], 2, "k2499", "a", "k2500", "b"), 0);
    e_msg(&e, 0, "message", "k2499", "a");
    OUTZ(&t.out, &e);
    zclear(&e);
    /* Unsubscribing them all: the replies at once, the SUBs 1000 at a time,
     * no wait. */
    CHECK_EQ(REQ(&t, "UNSUBSCRIBE"), FB_RESP_MESSAGE);
    CHECK_EQ(count_of(zdata(&t.out), zlen(&t.out), "$11\r\nunsubscribe\r\n"), N);
    CHECK(has(zdata(&t.out), zlen(&t.out), "\r\n:0\r\n"));
    zclear(&t.out);
    size_t total = 0;
    for (int s = 0; s < 3; s++) {
        if (s) CHECK_EQ(t_in(&t, "", 0), FB_RESP_MESSAGE);
        sub_of(&t.m, recs, N, &n);
        CHECK_EQ(n, s < 2 ? 1000 : 500);
        for (size_t i = 0; i < n; i++) CHECK(recs[i].payload_len == 1 && recs[i].payload[0] == 0);
        total += n;
    }
    CHECK_EQ(total, N);
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_MORE);
    OUT(&t.out, "+PONG\r\n");

    /* Exactly 1000: one SUB; 1001: two. */
    for (int k = 1000; k <= 1001; k++) {
        argv[0] = "PSUBSCRIBE";
        cmd_argv(&b, k + 1, argv, NULL);
        CHECK_EQ(t_in(&t, zdata(&b), zlen(&b)), FB_RESP_MESSAGE);
        zclear(&b);
        uint64_t s1 = sub_of(&t.m, recs, N, &n);
        CHECK_EQ(n, 1000);
        if (k == 1001) {
            CHECK_EQ(t_in(&t, "", 0), FB_RESP_MESSAGE);
            uint64_t s2 = sub_of(&t.m, recs, N, &n);
            CHECK_EQ(n, 1);
            CHECK(rec_is(&recs[0], "k1000", "\x05", 1));
            CHECK_EQ(t_in(&t, "", 0), FB_RESP_WAIT);
            CHECK_EQ(d_confirm(t.r, &t.out, s1), 0);
            CHECK_EQ(d_confirm(t.r, &t.out, s2), FB_RESP_RESUME);
            CHECK_EQ(count_of(zdata(&t.out), zlen(&t.out), "$10\r\npsubscribe\r\n"), 1001);
            CHECK(has(zdata(&t.out), zlen(&t.out), "$5\r\nk1000\r\n:1001\r\n"));
        } else {
            CHECK_EQ(t_in(&t, "", 0), FB_RESP_WAIT);
            CHECK_EQ(d_confirm(t.r, &t.out, s1), FB_RESP_RESUME);
            CHECK_EQ(count_of(zdata(&t.out), zlen(&t.out), "$10\r\npsubscribe\r\n"), 1000);
            CHECK_EQ(REQ(&t, "PUNSUBSCRIBE"), FB_RESP_MESSAGE);    /* back to none */
            sub_of(&t.m, recs, N, &n);
            CHECK_EQ(n, 1000);
        }
        zclear(&t.out);
    }
    fb_zbuf_free(&b);
    fb_zbuf_free(&e);
    t_close(&t);
}

static void test_inline(void)
{
    T t;
    t_open(&t, 0, 0);
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_MORE);
    CHECK_EQ(t.used, 6);
    OUT(&t.out, "+PONG\r\n");
    CHECK_EQ(t_raw(&t, "PING\n"), FB_RESP_MORE);      /* a bare newline ends one too */
    OUT(&t.out, "+PONG\r\n");
    CHECK_EQ(t_raw(&t, "  ECHO \t hi  \r\n"), FB_RESP_MORE);
    OUT(&t.out, "$2\r\nhi\r\n");
    CHECK_EQ(t_raw(&t, "\r\n\n   \r\nping\r\n"), FB_RESP_MORE);   /* empty lines: nothing */
    OUT(&t.out, "+PONG\r\n");
    /* Not whole: nothing taken. */
    CHECK_EQ(t_raw(&t, "PIN"), FB_RESP_MORE);
    CHECK_EQ(t.used, 0);
    CHECK_EQ(t_raw(&t, "PING\r"), FB_RESP_MORE);
    CHECK_EQ(t.used, 0);
    CHECK_EQ(zlen(&t.out), 0);
    /* Inline and RESP mixed. */
    CHECK_EQ(t_raw(&t, "ECHO a\r\n*2\r\n$4\r\nECHO\r\n$1\r\nb\r\nECHO c\n"), FB_RESP_MORE);
    OUT(&t.out, "$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n");
    /* Inline PUBLISH, SUBSCRIBE, and a command for the broker. */
    CHECK_EQ(t_raw(&t, "PUBLISH news hi\r\n"), FB_RESP_MESSAGE);
    fb_record recs[2];
    CHECK_EQ(decode(&t.m, 1, recs, 2), 1);
    CHECK(rec_is(&recs[0], "news", "hi", 2));
    fb_resp_session_routed(t.r, 2, 0, &t.out);
    OUT(&t.out, ":2\r\n");
    CHECK_EQ(t_raw(&t, "CLIENT  LIST\r\n"), FB_RESP_MESSAGE);
    CHECK(frame_is(&t.m, 2, "*2\r\n$6\r\nCLIENT\r\n$4\r\nLIST\r\n"));
    CHECK_EQ(d_reply(t.r, &t.out, "$0\r\n\r\n", FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    zclear(&t.out);
    CHECK_EQ(t_raw(&t, "subscribe a b\r\n"), FB_RESP_MESSAGE);
    uint64_t s = CHECK_SUB(&t.m, "a:1 b:1");
    CHECK_EQ(d_confirm(t.r, &t.out, s), FB_RESP_RESUME);
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n");
    t_close(&t);
}

static void test_noauth(void)
{
    T t;
    t_open(&t, 0, 1);
    static const char noauth[] = "-NOAUTH Authentication required.\r\n";
    const char *refused[] = {"PING", "ECHO x", "SUBSCRIBE a", "PSUBSCRIBE a*", "UNSUBSCRIBE", "PUBLISH a b",
                             "CLIENT LIST", "INFO"};
    for (int i = 0; i < 8; i++) {
        CHECK_EQ(REQ(&t, refused[i]), FB_RESP_MORE);
        OUT(&t.out, noauth);
    }
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_MORE);
    OUT(&t.out, noauth);
    CHECK(!fb_resp_session_pending(t.r));
    /* AUTH goes to the broker, which says whether it is right. */
    CHECK_EQ(REQ(&t, "AUTH wrong"), FB_RESP_MESSAGE);
    CHECK(frame_is(&t.m, 0, "r"));
    CHECK_EQ(t.m.f[1][0], FB_RESP_STATE_NEED_AUTH);
    CHECK(frame_is(&t.m, 2, "*2\r\n$4\r\nAUTH\r\n$5\r\nwrong\r\n"));
    CHECK_EQ(d_reply(t.r, &t.out, "-WRONGPASS invalid username-password pair or user is disabled.\r\n", 0),
             FB_RESP_RESUME);
    OUT(&t.out, "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
    CHECK_EQ(REQ(&t, "PING"), FB_RESP_MORE);
    OUT(&t.out, noauth);
    /* HELLO too (it may carry AUTH). */
    CHECK_EQ(REQ(&t, "HELLO 3 AUTH default pw"), FB_RESP_MESSAGE);
    CHECK_EQ(t.m.f[1][0], FB_RESP_STATE_NEED_AUTH);
    CHECK_EQ(d_reply(t.r, &t.out, "%0\r\n", FB_RESP_STATE_RESP3 | FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    OUT(&t.out, "%0\r\n");
    CHECK_EQ(REQ(&t, "PING"), FB_RESP_MORE);
    OUT(&t.out, "+PONG\r\n");
    CHECK_EQ(REQ(&t, "CLIENT LIST"), FB_RESP_MESSAGE);
    CHECK_EQ(t.m.f[1][0], FB_RESP_STATE_NEED_AUTH | FB_RESP_STATE_AUTHED | FB_RESP_STATE_RESP3);
    CHECK_EQ(d_reply(t.r, &t.out, "$0\r\n\r\n", FB_RESP_STATE_RESP3 | FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    zclear(&t.out);
    /* RESET: authentication is needed again. */
    CHECK_EQ(REQ(&t, "RESET"), FB_RESP_MORE);
    OUT(&t.out, "+RESET\r\n");
    CHECK_EQ(REQ(&t, "PING"), FB_RESP_MORE);
    OUT(&t.out, noauth);
    /* AUTH with a good password (state AUTHED). */
    CHECK_EQ(REQ(&t, "AUTH pw"), FB_RESP_MESSAGE);
    CHECK_EQ(d_reply(t.r, &t.out, "+OK\r\n", FB_RESP_STATE_AUTHED), FB_RESP_RESUME);
    OUT(&t.out, "+OK\r\n");
    SUBSCRIBE(&t, "SUBSCRIBE a", "a:1");
    OUT(&t.out, "*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n");
    CHECK_EQ(REQ(&t, "RESET"), FB_RESP_MESSAGE);
    zclear(&t.out);
    /* QUIT needs none. */
    CHECK_EQ(REQ(&t, "QUIT"), FB_RESP_CLOSE);
    OUT(&t.out, "+OK\r\n");
    t_close(&t);
}

static void test_yield(void)
{
    T t;
    t_open(&t, 0, 0);
    fb_zbuf b = {0}, e = {0};
    for (int i = 0; i < 600; i++) zputs(&b, "PING\r\n");
    CHECK_EQ(t_in(&t, zdata(&b), zlen(&b)), FB_RESP_YIELD);
    size_t first = t.used;
    CHECK(first > 0 && first < zlen(&b) && first % 6 == 0);
    for (size_t i = 0; i < first / 6; i++) zputs(&e, "+PONG\r\n");
    OUTZ(&t.out, &e);
    zclear(&e);
    CHECK_EQ(t_in(&t, zdata(&b) + first, zlen(&b) - first), FB_RESP_MORE);
    CHECK_EQ(t.used, zlen(&b) - first);
    for (size_t i = first / 6; i < 600; i++) zputs(&e, "+PONG\r\n");
    OUTZ(&t.out, &e);
    fb_zbuf_free(&b);
    fb_zbuf_free(&e);
    t_close(&t);
}

/* -- bad input ---------------------------------------------------------------------- */

typedef struct bad_case {
    const char *in;
    size_t n;          /* 0: strlen */
    const char *err;   /* after "-ERR Protocol error: " */
    uint64_t max_request;
} bad_case;

static const bad_case BAD[] = {
    {"*abc\r\n", 0, "invalid multibulk length", 0},                     /* garbage */
    {"*\r\n", 0, "invalid multibulk length", 0},
    {"*-\r\n", 0, "invalid multibulk length", 0},
    {"*1x\r\n", 0, "invalid multibulk length", 0},
    {"*2\n$4\r\nPING\r\n", 0, "invalid multibulk length", 0},           /* LF without CR */
    {"*2147483648\r\n", 0, "invalid multibulk length", 0},             /* 2^31 elements */
    {"*1048577\r\n", 0, "invalid multibulk length", 0},                /* one over Redis's bound */
    {"*99999999999999999999\r\n", 0, "invalid multibulk length", 0},   /* 20 digits */
    {"*1\r\n$1099511627776\r\n", 0, "invalid bulk length", 0},          /* 2^40 */
    {"*1\r\n$536870913\r\n", 0, "invalid bulk length", 0},              /* 512 MB + 1 */
    {"*1\r\n$-1\r\n", 0, "invalid bulk length", 0},                     /* negative */
    {"*1\r\n$-5\r\nabc\r\n", 0, "invalid bulk length", 0},
    {"*1\r\n$\r\n", 0, "invalid bulk length", 0},
    {"*1\r\n$3\rabc\r\n", 0, "invalid bulk length", 0},
    {"*1\r\n$99999999999999999999\r\n", 0, "invalid bulk length", 0},
    {"*1\r\n$3\r\nabcXY", 0, "expected CRLF after a bulk string", 0},    /* no CRLF after the bulk */
    {"*1\r\n$3\r\nabc\rX", 0, "expected CRLF after a bulk string", 0},
    {"*2\r\n:1\r\n", 0, "expected '$', got ':'", 0},
    {"*1\r\n*1\r\n$4\r\nPING\r\n", 0, "expected '$', got '*'", 0},
    {"*1\r\n\x01", 0, "expected '$', got '?'", 0},
    {"*2\r\n$4\r\nECHO\r\n$20\r\n01234567890123456789\r\n", 0, "invalid bulk length", 32},   /* over max_request */
};

/* Each: its error, then closed; what came before it is answered. */
static void test_bad_input(void)
{
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        T t;
        t_open(&t, BAD[i].max_request, 0);
        fb_zbuf b = {0}, e = {0};
        zputs(&b, "PING\r\n");
        zput(&b, BAD[i].in, BAD[i].n ? BAD[i].n : strlen(BAD[i].in));
        zputs(&b, "PING\r\n*1\r\n$4\r\nPING\r\n");    /* (never read) */
        int rc = t_in(&t, zdata(&b), zlen(&b));
        CHECK_EQ(rc, FB_RESP_CLOSE);
        CHECK_EQ(t.used, 6);
        zputs(&e, "+PONG\r\n-ERR Protocol error: ");
        zputs(&e, BAD[i].err);
        zputs(&e, "\r\n");
        if (!OUTZ(&t.out, &e)) fprintf(stderr, "    (case %zu)\n", i);
        CHECK_EQ(t_in(&t, zdata(&b) + 6, zlen(&b) - 6), FB_RESP_CLOSE);
        CHECK_EQ(t.used, 0);
        CHECK_EQ(zlen(&t.out), 0);
        fb_zbuf_free(&b);
        fb_zbuf_free(&e);
        t_close(&t);
    }
    /* Just within the bounds: not an error, more is awaited. */
    const char *ok[] = {"*1048576\r\n", "*1\r\n$536870912\r\n", "*-1\r\n", "*0\r\n", "*1\r\n$53687091\r\n"};
    for (int i = 0; i < 5; i++) {
        T t;
        t_open(&t, i == 1 ? 1ull << 40 : 0, 0);   /* (by default the whole request is bounded at 512 MB) */
        CHECK_EQ(t_raw(&t, ok[i]), FB_RESP_MORE);
        CHECK_EQ(zlen(&t.out), 0);
        t_close(&t);
    }
    /* A 64 KB inline request with no newline. */
    T t;
    t_open(&t, 0, 0);
    size_t big = FB_RESP_MAX_INLINE;
    char *p = malloc(big);
    REQUIRE(p);
    memset(p, 'A', big);
    CHECK_EQ(t_in(&t, p, big - 1), FB_RESP_MORE);    /* one short: still waiting */
    CHECK_EQ(zlen(&t.out), 0);
    CHECK_EQ(t_in(&t, p, big), FB_RESP_CLOSE);
    OUT(&t.out, "-ERR Protocol error: too big inline request\r\n");
    free(p);
    t_close(&t);
    /* A request as large as max_request is taken. */
    t_open(&t, 32, 0);
    CHECK_EQ(t_raw(&t, "*2\r\n$4\r\nECHO\r\n$11\r\n01234567890\r\n"), FB_RESP_MORE);   /* 32 bytes */
    OUT(&t.out, "$11\r\n01234567890\r\n");
    CHECK_EQ(t_raw(&t, "*2\r\n$4\r\nECHO\r\n$13\r\n"), FB_RESP_CLOSE);                  /* 33: no */
    OUT(&t.out, "-ERR Protocol error: invalid bulk length\r\n");
    t_close(&t);
}

/* -- split anywhere: the same as whole ------------------------------------------ */

/* A broker for a session: it answers each message at once (eager) or only
 * when the session waits (lazy), and records everything in `log`. */
typedef struct sim {
    T t;
    fb_zbuf log;      /* output, messages and results, in order */
    fb_zbuf outs;     /* the output alone */
    int lazy, resp3, nq;
    struct { char kind; uint64_t seq; } q[64];
    uint64_t routed, replies;
} sim;

static void sim_open(sim *s, int lazy, uint64_t max_request)
{
    memset(s, 0, sizeof *s);
    s->lazy = lazy;
    s->t.r = fb_resp_session_new(max_request, 0);
    REQUIRE(s->t.r);
}

static void sim_close(sim *s)
{
    t_close(&s->t);
    fb_zbuf_free(&s->log);
    fb_zbuf_free(&s->outs);
}

static void sim_flush(sim *s)
{
    zput(&s->log, zdata(&s->t.out), zlen(&s->t.out));
    zput(&s->outs, zdata(&s->t.out), zlen(&s->t.out));
    zclear(&s->t.out);
}

static void sim_rc(sim *s, const char *what, int rc)
{
    sim_flush(s);
    zprintf(&s->log, "\n{%s %d}\n", what, rc);
}

static void sim_answer(sim *s, char kind, uint64_t seq)
{
    fb_resp_session *r = s->t.r;
    fb_zbuf *out = &s->t.out;
    int rc = 0;
    switch (kind) {
    case 'H':
        rc = d_welcome(r, out);
        break;
    case 'S':   /* data first (held, if the session waits for this one), then CONFIRM */
        sim_rc(s, "data", d_data(r, out, seq, 3, "a", "early", "news", "n", "c", "cc"));
        rc = d_confirm(r, out, seq);
        break;
    case 'r': {
        char reply[32];
        snprintf(reply, sizeof reply, "+R%llu\r\n", (unsigned long long)++s->replies);
        rc = d_reply(r, out, reply, FB_RESP_STATE_AUTHED | (s->resp3 ? FB_RESP_STATE_RESP3 : 0));
        break;
    }
    }
    sim_rc(s, "answer", rc);
}

static void sim_message(sim *s)
{
    msg *m = &s->t.m;
    sim_flush(s);
    zputs(&s->log, "\n{M");
    for (int i = 0; i < m->n; i++) {
        zprintf(&s->log, " %zu:", m->len[i]);
        zput(&s->log, m->f[i], m->len[i]);
    }
    zputs(&s->log, "}\n");
    char kind = m->len[0] == 1 ? (char)m->f[0][0] : '?';
    uint64_t seq = kind == 'S' && m->n >= 2 && m->len[1] == 8 ? le64(m->f[1]) : 0;
    if (kind == 'P') {
        fb_resp_session_routed(s->t.r, ++s->routed, 0, &s->t.out);
        sim_flush(s);
        return;
    }
    if (kind == 'r' && m->n == 3) {
        if (has(m->f[2], m->len[2], "HELLO\r\n$1\r\n3")) s->resp3 = 1;
        if (has(m->f[2], m->len[2], "HELLO\r\n$1\r\n2")) s->resp3 = 0;
    }
    if (!s->lazy) {
        sim_answer(s, kind, seq);
        return;
    }
    REQUIRE(s->nq < 64);
    s->q[s->nq].kind = kind;
    s->q[s->nq++].seq = seq;
}

static void sim_drain(sim *s)
{
    for (int i = 0; i < s->nq; i++) sim_answer(s, s->q[i].kind, s->q[i].seq);
    s->nq = 0;
}

/* Feed data[0, total): first `first` bytes, then `step` more at each MORE,
 * the caller passing its unconsumed rest again each time (as
 * fb_zmtp_server.c does).  Ends at FB_RESP_CLOSE or with all of it read. */
static void sim_run(sim *s, const unsigned char *data, size_t total, size_t first, size_t step)
{
    size_t off = 0, fed = first < total ? first : total;
    for (long guard = 0;; guard++) {
        REQUIRE(guard < 50000000);
        size_t n = fed - off;
        unsigned char *w = malloc(n ? n : 1);   /* exactly the bytes at hand */
        REQUIRE(w);
        memcpy(w, data + off, n);
        size_t used = (size_t)-1;
        int rc = fb_resp_session_input(s->t.r, w, n, &used, &s->t.out);
        free(w);
        REQUIRE(used <= n);
        off += used;
        switch (rc) {
        case FB_RESP_MESSAGE:
            take(s->t.r, &s->t.m);
            sim_message(s);
            break;
        case FB_RESP_WAIT:
            CHECK_EQ(used, 0);
            sim_rc(s, "wait", rc);
            REQUIRE(s->nq > 0);                  /* (eager: it never waits) */
            sim_drain(s);
            break;
        case FB_RESP_CLOSE:
            sim_rc(s, "close", rc);
            return;
        case FB_RESP_YIELD:
            break;
        case FB_RESP_MORE:
            if (fed < total) {
                fed = total - fed > step ? fed + step : total;
                break;
            }
            if (s->nq) {
                sim_drain(s);
                break;
            }
            sim_flush(s);
            zprintf(&s->log, "\n{end, %zu left}\n", total - off);
            return;
        default:
            REQUIRE(!"unexpected result");
        }
    }
}

/* Is every split of `data` (and byte-at-a-time) the same as it whole? */
static int split_same(const unsigned char *data, size_t total, int lazy, uint64_t max_request, fb_zbuf *whole_log,
                      fb_zbuf *whole_out)
{
    sim whole;
    sim_open(&whole, lazy, max_request);
    sim_run(&whole, data, total, total, total);
    int ok = 1;
    for (size_t cut = 0; cut <= total + 1; cut++) {
        sim s;
        sim_open(&s, lazy, max_request);
        if (cut <= total) sim_run(&s, data, total, cut, total);   /* two pieces */
        else sim_run(&s, data, total, 1, 1);                       /* a byte at a time */
        if (zlen(&s.log) != zlen(&whole.log) || memcmp(zdata(&s.log), zdata(&whole.log), zlen(&s.log)) != 0) {
            if (ok && ctest_failures < 20) {
                fprintf(stderr, "    split at %zu (of %zu, lazy %d) differs\n", cut, total, lazy);
                size_t i = 0;
                while (i < zlen(&s.log) && i < zlen(&whole.log) && zdata(&s.log)[i] == zdata(&whole.log)[i]) i++;
                size_t from = i > 60 ? i - 60 : 0;
                show("split", zdata(&s.log) + from, zlen(&s.log) - from);
                show("whole", zdata(&whole.log) + from, zlen(&whole.log) - from);
            }
            ok = 0;
        }
        sim_close(&s);
    }
    zput(whole_log, zdata(&whole.log), zlen(&whole.log));
    zput(whole_out, zdata(&whole.outs), zlen(&whole.outs));
    sim_close(&whole);
    return ok;
}

static void test_cut_at_every_byte(void)
{
    fb_zbuf p = {0};
    zputs(&p, "PING\r\n");
    cmd_words(&p, "PING");
    const char *echo[2] = {"ECHO", "hello\r\nworld"};
    cmd_argv(&p, 2, echo, NULL);
    zputs(&p, "*0\r\n\r\n*-1\r\n");
    cmd_words(&p, "PUBLISH news abc");
    cmd_words(&p, "SUBSCRIBE a b");
    zputs(&p, "ping\r\n");
    cmd_words(&p, "publish a x");                    /* refused: subscribed mode */
    cmd_words(&p, "PSUBSCRIBE n*");
    cmd_words(&p, "UNSUBSCRIBE a");
    cmd_words(&p, "SSUBSCRIBE s1");
    zputs(&p, "RESET\r\n");
    cmd_words(&p, "CLIENT SETNAME foo");
    cmd_words(&p, "HELLO 3");
    cmd_words(&p, "SUBSCRIBE c");
    char big[301];
    memset(big, 'x', 300);
    big[300] = 0;
    const char *pub[3] = {"PUBLISH", "c", big};
    cmd_argv(&p, 3, pub, NULL);
    cmd_words(&p, "UNSUBSCRIBE");
    const char *e0[2] = {"ECHO", ""};
    cmd_argv(&p, 2, e0, NULL);
    zputs(&p, "ECHO   inline  \r\n");
    zputs(&p, "QUIT\r\nPING\r\n");                   /* (after QUIT: never read) */

    fb_zbuf wlog = {0}, wout = {0};
    for (int lazy = 0; lazy < 2; lazy++) {
        zclear(&wlog);
        zclear(&wout);
        CHECK(split_same(zdata(&p), zlen(&p), lazy, 0, &wlog, &wout));
        /* And the whole run is what it should be, in outline. */
        const unsigned char *l = zdata(&wlog), *w = zdata(&wout);
        size_t ln = zlen(&wlog), n = zlen(&wout);
        CHECK_EQ(count_of(l, ln, "{M "), 12);           /* H P S S S S S r r S P S */
        CHECK_EQ(count_of(l, ln, "{M 1:S "), 7);
        CHECK_EQ(count_of(w, n, "+PONG\r\n"), 2);
        CHECK(has(w, n, "$12\r\nhello\r\nworld\r\n"));
        CHECK(has(w, n, ":1\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n"
                        "*3\r\n$7\r\nmessage\r\n$1\r\na\r\n$5\r\nearly\r\n"));
        CHECK(has(w, n, "*2\r\n$4\r\npong\r\n$0\r\n\r\n-ERR Can't execute 'publish'"));
        CHECK(has(w, n, "*4\r\n$8\r\npmessage\r\n$2\r\nn*\r\n$4\r\nnews\r\n$1\r\nn\r\n"));
        CHECK(has(w, n, "+RESET\r\n"));
        CHECK(has(w, n, "+R1\r\n"));
        CHECK(has(w, n, "+R2\r\n"));
        CHECK(has(w, n, ">3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n>3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\ncc\r\n"));
        CHECK(has(w, n, ":2\r\n>3\r\n$11\r\nunsubscribe\r\n$1\r\nc\r\n:0\r\n"));
        CHECK(has(w, n, "$0\r\n\r\n$6\r\ninline\r\n+OK\r\n"));
        CHECK(n >= 5 && memcmp(w + n - 5, "+OK\r\n", 5) == 0);   /* QUIT's reply is the last */
        CHECK(has(l, ln, "+OK\r\n\n{close 3}\n"));
        CHECK(!has(l, ln, "{end"));
        if (lazy) CHECK(count_of(l, ln, "{wait 2}") >= 5);
    }

    /* The bad inputs, split anywhere: the same error at the same point. */
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        fb_zbuf b = {0};
        zputs(&b, "ECHO x\r\n");
        zput(&b, BAD[i].in, BAD[i].n ? BAD[i].n : strlen(BAD[i].in));
        zputs(&b, "PING\r\n");
        zclear(&wlog);
        zclear(&wout);
        if (!split_same(zdata(&b), zlen(&b), 0, BAD[i].max_request, &wlog, &wout))
            fprintf(stderr, "    (bad case %zu)\n", i);
        fb_zbuf e = {0};
        zputs(&e, "$1\r\nx\r\n-ERR Protocol error: ");
        zputs(&e, BAD[i].err);
        zputs(&e, "\r\n");
        OUTZ(&wout, &e);
        CHECK(has(zdata(&wlog), zlen(&wlog), "{close 3}"));
        fb_zbuf_free(&e);
        fb_zbuf_free(&b);
    }
    fb_zbuf_free(&wlog);
    fb_zbuf_free(&wout);
    fb_zbuf_free(&p);
}

/* A long request fed a byte at a time completes, and is read once (a
 * rescanning parser would take quadratic time here). */
static void test_byte_at_a_time(void)
{
    T t;
    t_open(&t, 0, 0);
    size_t big = 2u << 20;
    fb_zbuf b = {0};
    char *payload = malloc(big);
    REQUIRE(payload);
    for (size_t i = 0; i < big; i++) payload[i] = (char)('a' + i % 26);
    const char *w[3] = {"ECHO", payload};
    size_t wn[3] = {4, big};
    cmd_argv(&b, 2, w, wn);
    const unsigned char *d = zdata(&b);
    size_t n = zlen(&b), i;
    int rc = FB_RESP_MORE;
    for (i = 1; i <= n; i++) {
        size_t used = 1;
        rc = fb_resp_session_input(t.r, d, i, &used, &t.out);   /* from the same start each time */
        if (rc != FB_RESP_MORE || used != (i == n ? n : 0)) break;
    }
    CHECK_EQ(i, n + 1);
    CHECK_EQ(rc, FB_RESP_MORE);
    fb_zbuf e = {0};
    zprintf(&e, "$%zu\r\n", big);
    zput(&e, payload, big);
    zputs(&e, "\r\n");
    OUTZ(&t.out, &e);
    fb_resp_session_stats st;
    fb_resp_session_get_stats(t.r, &st);
    CHECK_EQ(st.requests, 1);
    /* Many arguments a byte at a time: a PUBLISH with a big payload. */
    zclear(&b);
    const char *pw[3] = {"PUBLISH", "chan", payload};
    size_t pwn[3] = {7, 4, 100000};
    cmd_argv(&b, 3, pw, pwn);
    d = zdata(&b);
    n = zlen(&b);
    for (i = 1; i <= n; i++) {
        size_t used = 0;
        rc = fb_resp_session_input(t.r, d, i, &used, &t.out);
        if (rc != FB_RESP_MORE) {
            CHECK_EQ(used, n);
            break;
        }
        CHECK_EQ(used, 0);
    }
    CHECK_EQ(i, n);
    CHECK_EQ(rc, FB_RESP_MESSAGE);
    take(t.r, &t.m);
    fb_record recs[1];
    CHECK_EQ(decode(&t.m, 1, recs, 1), 1);
    CHECK(rec_is(&recs[0], "chan", payload, 100000));
    fb_resp_session_routed(t.r, 0, 0, &t.out);
    OUT(&t.out, ":0\r\n");
    t_close(&t);

    /* A SUBSCRIBE of 1500 keys (two SUBs), a byte at a time and split
     * anywhere, the same as whole. */
    zclear(&b);
    static char names[1500][16];
    static const char *argv[1501];
    argv[0] = "SUBSCRIBE";
    for (int k = 0; k < 1500; k++) {
        snprintf(names[k], sizeof names[k], "k%d", k);
        argv[k + 1] = names[k];
    }
    cmd_argv(&b, 1501, argv, NULL);
    zputs(&b, "PING\r\n");
    size_t sub_len = zlen(&b) - 6;
    for (int lazy = 0; lazy < 2; lazy++) {
        sim whole, s;
        sim_open(&whole, lazy, 0);
        sim_run(&whole, zdata(&b), zlen(&b), zlen(&b), zlen(&b));
        CHECK_EQ(count_of(zdata(&whole.log), zlen(&whole.log), "{M "), 3);   /* HELLO, 2 SUBs */
        CHECK_EQ(count_of(zdata(&whole.outs), zlen(&whole.outs), "$9\r\nsubscribe\r\n"), 1500);
        CHECK(has(zdata(&whole.outs), zlen(&whole.outs), "$2\r\nk0\r\n:1\r\n"));
        CHECK(has(zdata(&whole.outs), zlen(&whole.outs), "$5\r\nk1499\r\n:1500\r\n*2\r\n$4\r\npong\r\n"));
        sim_open(&s, lazy, 0);
        sim_run(&s, zdata(&b), zlen(&b), 1, 1);
        CHECK(zlen(&s.log) == zlen(&whole.log) && memcmp(zdata(&s.log), zdata(&whole.log), zlen(&s.log)) == 0);
        sim_close(&s);
        for (size_t cut = 1; cut < zlen(&b); cut += cut < 64 || cut > sub_len - 64 ? 1 : 97) {
            sim_open(&s, lazy, 0);
            sim_run(&s, zdata(&b), zlen(&b), cut, zlen(&b));
            CHECK(zlen(&s.log) == zlen(&whole.log) && memcmp(zdata(&s.log), zdata(&whole.log), zlen(&s.log)) == 0);
            sim_close(&s);
        }
        sim_close(&whole);
    }
    fb_zbuf_free(&b);
    fb_zbuf_free(&e);
    free(payload);
}

/* Subscribing and unsubscribing for ever: the right answers throughout,
 * and the key sets' memory stays that of the keys held. */
static void test_churn(void)
{
    T t;
    t_open(&t, 0, 0);
    SUBSCRIBE(&t, "SUBSCRIBE keep", "keep:1");
    SUBSCRIBE(&t, "PSUBSCRIBE pkeep*", "pkeep*:5");
    zclear(&t.out);
    char words[64], ops[64];
#ifdef HAVE_MALLINFO2
    size_t before = 0;
#endif
    enum { CYCLES = 200000 };
    for (int i = 0; i < CYCLES; i++) {
#ifdef HAVE_MALLINFO2
        if (i == 1000) before = mallinfo2().uordblks;
#endif
        int pat = i & 1;
        snprintf(words, sizeof words, "%s k%d%s", pat ? "PSUBSCRIBE" : "SUBSCRIBE", i, pat ? "*" : "");
        snprintf(ops, sizeof ops, "k%d%s:%d", i, pat ? "*" : "", pat ? 5 : 1);
        SUBSCRIBE(&t, words, ops);
        if (!has(zdata(&t.out), zlen(&t.out), ":3\r\n")) CHECK(!"count 3");
        zclear(&t.out);
        snprintf(words, sizeof words, "%s k%d%s", pat ? "PUNSUBSCRIBE" : "UNSUBSCRIBE", i, pat ? "*" : "");
        snprintf(ops, sizeof ops, "k%d%s:%d", i, pat ? "*" : "", pat ? 4 : 0);
        if (REQ(&t, words) != FB_RESP_MESSAGE) CHECK(!"a SUB");
        CHECK_SUB(&t.m, ops);
        if (!has(zdata(&t.out), zlen(&t.out), ":2\r\n")) CHECK(!"count 2");
        zclear(&t.out);
        if (ctest_failures) break;
    }
#ifdef HAVE_MALLINFO2
    size_t after = mallinfo2().uordblks;
    /* (Each cycle used to leave a tombstone that a rehash then doubled:
     * megabytes by now.) */
    CHECK(after < before + 64 * 1024);
#endif
    CHECK_EQ(d_data(t.r, &t.out, 1, 3, "keep", "1", "k7", "2", "pkeep-x", "3"), 0);
    fb_zbuf e = {0};
    e_msg(&e, 0, "message", "keep", "1");
    e_pmsg(&e, 0, "pkeep*", "pkeep-x", "3");
    OUTZ(&t.out, &e);
    zclear(&e);
    /* Many keys, dropped in a scrambled order and taken again. */
    enum { K = 3000 };
    static char names[K][16];
    for (int i = 0; i < K; i++) snprintf(names[i], sizeof names[i], "m%d", i);
    fb_zbuf b = {0};
    static const char *argv[K + 1];
    argv[0] = "SUBSCRIBE";
    for (int i = 0; i < K; i++) argv[i + 1] = names[i];
    cmd_argv(&b, K + 1, argv, NULL);
    CHECK_EQ(t_in(&t, zdata(&b), zlen(&b)), FB_RESP_MESSAGE);
    while (t_in(&t, "", 0) == FB_RESP_MESSAGE) {}
    uint64_t last = le64(t.m.f[1]);
    CHECK_EQ(d_confirm(t.r, &t.out, last), FB_RESP_RESUME);
    CHECK(has(zdata(&t.out), zlen(&t.out), "$5\r\nm2999\r\n:3002\r\n"));
    zclear(&t.out);
    static int order[K];
    for (int i = 0; i < K; i++) order[i] = i;
    for (int i = K - 1; i > 0; i--) {
        int j = (int)rndn((unsigned)i + 1), x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
    for (int i = 0; i < K / 2; i++) {
        snprintf(words, sizeof words, "UNSUBSCRIBE %s", names[order[i]]);
        REQ(&t, words);
    }
    zclear(&t.out);
    /* Half held, half not: data says which. */
    int wrong = 0;
    for (int i = 0; i < K; i++) {
        CHECK_EQ(d_data(t.r, &t.out, last, 1, names[order[i]], "v"), 0);
        if ((zlen(&t.out) > 0) != (i >= K / 2)) wrong++;
        zclear(&t.out);
    }
    CHECK_EQ(wrong, 0);
    fb_zbuf_free(&b);
    fb_zbuf_free(&e);
    t_close(&t);
}

/* Data held behind a subscribe reply is bounded: past 64 MB, close. */
static void test_hold_bound(void)
{
    T t;
    t_open(&t, 0, 0);
    CHECK_EQ(REQ(&t, "SUBSCRIBE a"), FB_RESP_MESSAGE);
    uint64_t seq = CHECK_SUB(&t.m, "a:1");
    size_t big = 4u << 20;
    fb_zbuf b = {0};
    batch_header(&b, 1);
    char *payload = calloc(1, big);
    REQUIRE(payload);
    batch_record(&b, "a", 1, payload, big);
    free(payload);
    unsigned char s8[8];
    put64(s8, seq);
    fb_resp_frame f[3] = {{U("D"), 1}, {s8, 8}, {zdata(&b), zlen(&b)}};
    int rc = 0, i;
    for (i = 0; i < 40 && rc == 0; i++) rc = dl(t.r, &t.out, f, 3);
    CHECK_EQ(rc, FB_RESP_CLOSE);
    CHECK_EQ(i, 16);                                /* 16 x (4 MB and its push header) > 64 MB */
    CHECK_EQ(zlen(&t.out), 0);
    CHECK_EQ(t_raw(&t, "PING\r\n"), FB_RESP_CLOSE);
    CHECK_EQ(t.used, 0);
    fb_zbuf_free(&b);
    t_close(&t);
}

int main(void)
{
    RUN(test_hello_first);
    RUN(test_ping_echo_quit_resp2);
    RUN(test_python_replies_and_resp3);
    RUN(test_publish);
    RUN(test_subscribe_confirm);
    RUN(test_data_held_until_confirm);
    RUN(test_message_kinds);
    RUN(test_message_kinds_resp3);
    RUN(test_unsubscribe);
    RUN(test_refused);
    RUN(test_subscribed_mode_resp2);
    RUN(test_many_keys);
    RUN(test_inline);
    RUN(test_noauth);
    RUN(test_yield);
    RUN(test_bad_input);
    RUN(test_cut_at_every_byte);
    RUN(test_byte_at_a_time);
    RUN(test_churn);
    RUN(test_hold_bound);
    CTEST_END();
}
