/* fb_replies.c - requests waiting for their replies (see fb_replies.h). */
#define _POSIX_C_SOURCE 200809L
#include "fb_replies.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fb_batch.h"

/* One waiting request.  Slots are allocated one by one and never move: a
 * thread waits on its slot's condition variable while the table grows. */
typedef struct slot {
    uint64_t id;
    int state;                   /* FB_REPLY_* */
    int async;
    int waiting;                 /* a thread is in fb_replies_wait on it */
    int asked_to_lead;
    pthread_cond_t cv;
    fb_reply reply;
} slot;

struct fb_replies {
    pthread_mutex_t mu;
    unsigned char *prefix;
    size_t prefix_len;
    uint32_t max_pending;
    slot **slots;                /* by id & (cap - 1); NULL: free */
    uint32_t cap, pending;
    uint64_t next_id;
    int leading;                 /* a thread reads the inbox now */
    int read_elsewhere;          /* fb_replies_set_read_elsewhere: nobody is asked to lead */
    int closed;
    int wake_fd;
    uint64_t *done;              /* async requests completed, for fb_replies_done */
    size_t ndone, capdone;
    fb_replies_stats st;
};

fb_replies *fb_replies_new(const void *prefix, size_t prefix_len, uint32_t max_pending)
{
    fb_replies *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->prefix = malloc(prefix_len ? prefix_len : 1);
    t->cap = 64;
    t->slots = calloc(t->cap, sizeof *t->slots);
    if (!t->prefix || !t->slots) {
        free(t->prefix);
        free(t->slots);
        free(t);
        return NULL;
    }
    memcpy(t->prefix, prefix, prefix_len);
    t->prefix_len = prefix_len;
    t->max_pending = max_pending ? max_pending : 1;
    t->next_id = 1;
    t->wake_fd = -1;
    pthread_mutex_init(&t->mu, NULL);
    return t;
}

static void slot_free(slot *s)
{
    fb_free(s->reply.buf);
    pthread_cond_destroy(&s->cv);
    free(s);
}

void fb_replies_free(fb_replies *t)
{
    if (!t) return;
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->slots[i]) slot_free(t->slots[i]);
    free(t->slots);
    free(t->prefix);
    free(t->done);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void fb_replies_set_wake_fd(fb_replies *t, int fd)
{
    pthread_mutex_lock(&t->mu);
    t->wake_fd = fd;
    pthread_mutex_unlock(&t->mu);
}

static slot *find(const fb_replies *t, uint64_t id)
{
    slot *s = t->slots[id & (t->cap - 1)];
    return s && s->id == id ? s : NULL;
}

/* Double the table until id's place is free.  Live ids are distinct modulo
 * the old size (each holds its place), so they are modulo the new one. */
static int grow_for(fb_replies *t, uint64_t id)
{
    while (t->slots[id & (t->cap - 1)]) {
        if (t->cap >= (1u << 30)) return FB_ENOMEM;
        uint32_t nc = t->cap * 2;
        slot **ns = calloc(nc, sizeof *ns);
        if (!ns) return FB_ENOMEM;
        for (uint32_t i = 0; i < t->cap; i++)
            if (t->slots[i]) ns[t->slots[i]->id & (nc - 1)] = t->slots[i];
        free(t->slots);
        t->slots = ns;
        t->cap = nc;
    }
    return FB_OK;
}

int fb_replies_open(fb_replies *t, int async, uint64_t *id)
{
    slot *s = calloc(1, sizeof *s);
    if (!s) return FB_ENOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);     /* deadlines are fb_now_ns's */
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->async = async != 0;
    pthread_mutex_lock(&t->mu);
    int rc = t->pending >= t->max_pending ? FB_ELIMIT : grow_for(t, t->next_id);
    if (rc == FB_OK) {
        s->id = t->next_id++;
        t->slots[s->id & (t->cap - 1)] = s;
        t->pending++;
        t->st.opened++;
        *id = s->id;
    }
    pthread_mutex_unlock(&t->mu);
    if (rc < 0) slot_free(s);
    return rc;
}

/* A slot that completed: its waiter (or the event loop) is told. */
static void completed(fb_replies *t, slot *s)
{
    if (s->async) {
        if (t->ndone == t->capdone) {
            size_t c = t->capdone ? t->capdone * 2 : 64;
            uint64_t *d = realloc(t->done, c * sizeof *d);
            if (!d) return;      /* (the loop still finds it by fb_replies_state) */
            t->done = d;
            t->capdone = c;
        }
        t->done[t->ndone++] = s->id;
        if (t->ndone == 1 && t->wake_fd >= 0) {
            uint64_t one = 1;
            ssize_t w = write(t->wake_fd, &one, sizeof one);
            (void)w;             /* a full pipe: the loop is awake already */
        }
    } else {
        pthread_cond_signal(&s->cv);
    }
}

/* Another waiting thread leads (the caller holds the mutex). */
static void pass_lead(fb_replies *t)
{
    t->leading = 0;
    if (t->read_elsewhere) return;
    for (uint32_t i = 0; i < t->cap; i++) {
        slot *s = t->slots[i];
        if (s && s->waiting && s->state == FB_REPLY_WAITING && !s->asked_to_lead) {
            s->asked_to_lead = 1;
            t->leading = 1;      /* (held for it: no other waiter takes it meanwhile) */
            pthread_cond_signal(&s->cv);
            return;
        }
    }
}

int fb_replies_wait(fb_replies *t, uint64_t id, uint64_t deadline_ns)
{
    pthread_mutex_lock(&t->mu);
    slot *s = find(t, id);
    int rc;
    if (!s) {
        rc = FB_ENOTFOUND;
    } else {
        s->waiting = 1;
        for (;;) {
            /* Asked to lead but leaving without: the role goes on to
             * another waiter (pass_lead skips this slot while asked). */
            if (s->state != FB_REPLY_WAITING || t->closed || fb_now_ns() >= deadline_ns) {
                rc = s->state != FB_REPLY_WAITING ? s->state : t->closed ? FB_REPLY_CLOSED : FB_REPLY_TIMEOUT;
                if (rc == FB_REPLY_TIMEOUT) t->st.timed_out++;
                if (s->asked_to_lead) {
                    pass_lead(t);
                    s->asked_to_lead = 0;
                }
                break;
            }
            if (s->asked_to_lead) {
                s->asked_to_lead = 0;                     /* (t->leading was kept for it) */
                rc = FB_REPLY_LEAD;
                break;
            }
            if (!t->leading && !t->read_elsewhere) {
                t->leading = 1;
                rc = FB_REPLY_LEAD;
                break;
            }
            struct timespec ts = { (time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u) };
            pthread_cond_timedwait(&s->cv, &t->mu, &ts);
        }
        s->waiting = 0;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void fb_replies_set_read_elsewhere(fb_replies *t, int on)
{
    pthread_mutex_lock(&t->mu);
    t->read_elsewhere = on;
    if (!on && !t->leading) pass_lead(t);   /* (a waiter reads from now on) */
    pthread_mutex_unlock(&t->mu);
}

void fb_replies_unlead(fb_replies *t)
{
    pthread_mutex_lock(&t->mu);
    pass_lead(t);
    pthread_mutex_unlock(&t->mu);
}

int fb_replies_state(fb_replies *t, uint64_t id)
{
    pthread_mutex_lock(&t->mu);
    slot *s = find(t, id);
    int rc = s ? s->state : FB_ENOTFOUND;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int fb_replies_close(fb_replies *t, uint64_t id, fb_reply *out)
{
    pthread_mutex_lock(&t->mu);
    slot *s = find(t, id);
    int rc = FB_ENOTFOUND;
    if (s) {
        rc = s->state;
        t->slots[id & (t->cap - 1)] = NULL;
        t->pending--;
        if (s->asked_to_lead) pass_lead(t);
    }
    pthread_mutex_unlock(&t->mu);
    if (!s) return rc;
    if (out) {
        *out = s->reply;
        s->reply.buf = NULL;
    }
    slot_free(s);
    return rc;
}

/* The request id a channel names: prefix, then decimal digits (no sign, no
 * leading zero, at most 19).  0 if it names none (ids start at 1). */
static uint64_t id_of(const fb_replies *t, const unsigned char *topic, uint32_t len)
{
    if (len <= t->prefix_len || len - t->prefix_len > 19 || memcmp(topic, t->prefix, t->prefix_len) != 0)
        return 0;
    const unsigned char *p = topic + t->prefix_len, *end = topic + len;
    if (*p == '0') return 0;
    uint64_t id = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') return 0;
        id = id * 10 + (uint64_t)(*p - '0');
    }
    return id;
}

static int is_no_responders(const fb_record *rec)
{
    static const unsigned char name[] = FB_HEADER_STATUS, value[] = FB_STATUS_NO_RESPONDERS;
    const unsigned char *p = rec->headers, *end = rec->headers + rec->headers_len;
    fb_header h;
    while (fb_headers_next(&p, end, &h))
        if (h.key_len == sizeof name - 1 && !memcmp(h.key, name, sizeof name - 1))
            return h.value_len == sizeof value - 1 && !memcmp(h.value, value, sizeof value - 1);
    return 0;
}

int fb_replies_take(fb_replies *t, const void *batch, size_t len)
{
    uint32_t count;
    int rc = fb_batch_header(batch, len, &count, NULL);
    if (rc < 0) return rc;
    if (count > len) return FB_EMALFORMED;
    fb_record *recs = malloc((count ? count : 1) * sizeof *recs);
    if (!recs) return FB_ENOMEM;
    size_t n = 0;
    rc = fb_batch_decode(batch, len, NULL, recs, count, &n);
    if (rc < 0) {
        free(recs);
        return rc;
    }
    int matched = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < n; i++) {
        const fb_record *rec = &recs[i];
        uint64_t id = id_of(t, rec->topic, rec->topic_len);
        slot *s = id ? find(t, id) : NULL;
        if (!s || s->state != FB_REPLY_WAITING) {
            t->st.unmatched++;
            continue;
        }
        if (rec->headers_len && rec->payload_len == 0 && is_no_responders(rec)) {
            s->state = FB_REPLY_NO_RESPONDERS;
            t->st.no_responders++;
        } else {
            size_t total = (size_t)rec->headers_len + rec->payload_len;
            unsigned char *buf = malloc(total ? total : 1);
            if (!buf) continue;  /* no memory: as if it never came (the request times out) */
            if (rec->headers_len) memcpy(buf, rec->headers, rec->headers_len);
            if (rec->payload_len) memcpy(buf + rec->headers_len, rec->payload, rec->payload_len);
            s->reply = (fb_reply){ buf, total, rec->headers_len };
            s->state = FB_REPLY_DONE;
            t->st.replied++;
        }
        matched++;
        completed(t, s);
    }
    pthread_mutex_unlock(&t->mu);
    free(recs);
    return matched;
}

size_t fb_replies_done(fb_replies *t, uint64_t *ids, size_t cap)
{
    pthread_mutex_lock(&t->mu);
    size_t n = t->ndone < cap ? t->ndone : cap;
    memcpy(ids, t->done, n * sizeof *ids);
    memmove(t->done, t->done + n, (t->ndone - n) * sizeof *ids);
    t->ndone -= n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

void fb_replies_close_all(fb_replies *t)
{
    pthread_mutex_lock(&t->mu);
    t->closed = 1;
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->slots[i]) pthread_cond_signal(&t->slots[i]->cv);
    pthread_mutex_unlock(&t->mu);
}

void fb_replies_get_stats(fb_replies *t, fb_replies_stats *out)
{
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    pthread_mutex_unlock(&t->mu);
}
