/* fb_links.c - the data plane's table of links (see fb_links.h). */
#include "fb_links.h"

#include "fb_protocol.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define INDEX_MIN 64u

/* FNV-1a: routing ids are short and often differ only in their last bytes. */
static uint32_t hash_id(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

/* Room in the event list: three a link pending (gone or slow once,
 * overflow once, a WANT mark or a detach once) and one FLOW. */
static size_t event_room(uint32_t n) { return 3 * (size_t)n + 1; }

int fb_links_init(fb_links *t)
{
    memset(t, 0, sizeof(*t));
    t->index = calloc(INDEX_MIN, sizeof(uint32_t));
    if (!t->index) {
        errno = ENOMEM;
        return -1;
    }
    t->icap = INDEX_MIN;
    t->max_queue = (size_t)64 << 20;
    if (fb_links_reserve(t, 0) < 0) {
        free(t->index);
        t->index = NULL;
        t->icap = 0;
        return -1;
    }
    return 0;
}

void fb_links_free(fb_links *t, const fb_zmq_msg_calls *z)
{
    for (uint32_t k = 0; k < t->n; k++) {
        fb_linkq_clear(z, &t->at[k].q);
        fb_ring_clear(&t->at[k].ring);
    }
    free(t->at);
    free(t->index);
    free(t->blocked);
    free(t->dirty);
    free(t->events);
    memset(t, 0, sizeof(*t));
}

int fb_links_reserve(fb_links *t, uint32_t link)
{
    if (link < t->n) return 0;
    if (link >= FB_LINKS_MAX) {
        errno = EINVAL;
        return -1;
    }
    uint32_t n = t->n ? t->n * 2 : 64;
    while (n <= link) n *= 2;
    /* Each list first, the links last: a failure part way leaves lists
     * larger than needed, never a link without its room. */
    uint32_t *b = realloc(t->blocked, n * sizeof(uint32_t));
    if (!b) goto nomem;
    t->blocked = b;
    b = realloc(t->dirty, n * sizeof(uint32_t));
    if (!b) goto nomem;
    t->dirty = b;
    fb_link_event *e = realloc(t->events, event_room(n) * sizeof(fb_link_event));
    if (!e) goto nomem;
    t->events = e;
    fb_link *p = realloc(t->at, n * sizeof(fb_link));
    if (!p) goto nomem;
    memset(p + t->n, 0, (size_t)(n - t->n) * sizeof(fb_link));
    t->at = p;
    t->n = n;
    return 0;
nomem:
    errno = ENOMEM;
    return -1;
}

uint32_t fb_links_find(const fb_links *t, const uint8_t *ident, size_t n)
{
    uint32_t mask = t->icap - 1;
    uint32_t i = hash_id(ident, n) & mask;
    for (;;) {
        uint32_t v = t->index[i];
        if (v == 0) return FB_LINK_NONE;
        if (v != FB_LINK_NONE) {
            const fb_link *s = &t->at[v - 1];
            if (s->idlen == n && memcmp(s->ident, ident, n) == 0) return v - 1;
        }
        i = (i + 1) & mask;
    }
}

/* Rebuild the index for the links in it, at most a quarter full and
 * without tombstones: 0, or -1 (ENOMEM; the old index stays). */
static int rehash(fb_links *t)
{
    uint32_t live = 0, cap = INDEX_MIN;
    for (uint32_t k = 0; k < t->icap; k++)
        if (t->index[k] != 0 && t->index[k] != FB_LINK_NONE) live++;
    while (cap < 4 * ((size_t)live + 1)) cap *= 2;
    uint32_t *index = calloc(cap, sizeof(uint32_t));
    if (!index) {
        errno = ENOMEM;
        return -1;
    }
    for (uint32_t k = 0; k < t->icap; k++) {
        uint32_t v = t->index[k];
        if (v == 0 || v == FB_LINK_NONE) continue;
        const fb_link *s = &t->at[v - 1];
        uint32_t i = hash_id(s->ident, s->idlen) & (cap - 1);
        while (index[i] != 0) i = (i + 1) & (cap - 1);
        index[i] = v;
    }
    free(t->index);
    t->index = index;
    t->icap = cap;
    t->iused = live;
    return 0;
}

int fb_links_name(fb_links *t, uint32_t link, const uint8_t *ident, size_t n)
{
    if (n < 1 || n > FB_LINK_IDENT_MAX || link >= t->n) {
        errno = EINVAL;
        return -1;
    }
    if (((size_t)t->iused + 1) * 2 > t->icap && rehash(t) < 0) return -1;
    uint32_t other = fb_links_find(t, ident, n);
    if (other != FB_LINK_NONE) {
        fb_links_unname(t, other);
        t->at[other].session = 0;
    }
    fb_link *s = &t->at[link];
    s->idlen = (uint8_t)n;
    memcpy(s->ident, ident, n);
    uint32_t mask = t->icap - 1;
    uint32_t i = hash_id(ident, n) & mask;
    while (t->index[i] != 0 && t->index[i] != FB_LINK_NONE) i = (i + 1) & mask;
    if (t->index[i] == 0) t->iused++;
    t->index[i] = link + 1;
    return 0;
}

void fb_links_unname(fb_links *t, uint32_t link)
{
    if (link >= t->n || t->at[link].idlen == 0) return;
    const fb_link *s = &t->at[link];
    uint32_t mask = t->icap - 1;
    uint32_t i = hash_id(s->ident, s->idlen) & mask;
    for (;;) {
        uint32_t v = t->index[i];
        if (v == 0) return;
        if (v == link + 1) {
            t->index[i] = FB_LINK_NONE;     /* a tombstone: later ids probed past this cell */
            return;
        }
        i = (i + 1) & mask;
    }
}

int fb_links_block(fb_links *t, uint32_t link)
{
    fb_link *s = &t->at[link];
    if (s->blocked) return 0;
    s->blocked = 1;
    if (!s->detached) t->blocked[t->nblocked++] = link;
    if (t->hold) t->hold(t->hold_arg, link, 1);
    return 1;
}

int fb_links_unblock(fb_links *t, uint32_t link)
{
    fb_link *s = &t->at[link];
    if (!s->blocked) return 0;
    s->blocked = 0;
    for (uint32_t i = 0; i < t->nblocked; i++) {
        if (t->blocked[i] == link) {
            t->blocked[i] = t->blocked[--t->nblocked];
            break;
        }
    }
    if (t->hold) t->hold(t->hold_arg, link, 0);
    return 1;
}

void fb_links_mark_dirty(fb_links *t, uint32_t link)
{
    fb_link *s = &t->at[link];
    if (s->jdirty || !s->jhas || t->ndirty >= t->n) return;
    s->jdirty = 1;
    t->dirty[t->ndirty++] = link;
}

void fb_links_event(fb_links *t, uint32_t kind, uint32_t link, uint32_t value)
{
    if (t->nevents >= event_room(t->n)) return;   /* (the caller's rule keeps it from happening) */
    fb_link_event *e = &t->events[t->nevents++];
    e->kind = kind;
    e->link = link;
    e->value = value;
}

int fb_links_has_event(const fb_links *t, uint32_t kind, uint32_t link)
{
    for (uint32_t i = 0; i < t->nevents; i++)
        if (t->events[i].kind == kind && t->events[i].link == link) return 1;
    return 0;
}

void fb_links_forget_events(fb_links *t, uint32_t link, uint32_t keep)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < t->nevents; i++)
        if (t->events[i].link != link || t->events[i].kind == keep) t->events[k++] = t->events[i];
    t->nevents = k;
}

/* -- a link lost, detached, started over ----------------------------------- */

void fb_links_detach(fb_links *t, uint32_t link)
{
    fb_link *s = &t->at[link];
    if (s->detached) return;
    fb_links_unblock(t, link);               /* out of the list of links retried ... */
    s->detached = 1;
    if (fb_links_release(t, link)) fb_links_ask_flow(t);
    fb_links_block(t, link);                 /* ... still held (not listed: detached) */
    if (!fb_links_has_event(t, FB_EVENT_DETACHED, link))   /* (one pending: the events' room counts so) */
        fb_links_event(t, FB_EVENT_DETACHED, link, 0);
}

void fb_links_reset(fb_links *t, uint32_t link, const fb_zmq_msg_calls *z)
{
    if (link >= t->n) return;
    fb_link *s = &t->at[link];
    fb_linkq_clear(z, &s->q);
    fb_ring_clear(&s->ring);
    s->detached = 0;
    if (fb_links_release(t, link)) fb_links_ask_flow(t);
    s->exempt = 0;
    s->asked = 0;
    s->overflowed = 0;
    fb_links_unblock(t, link);
    fb_links_forget_events(t, link, FB_EVENT_FLOW);
}

void fb_links_lose(fb_links *t, uint32_t link, uint32_t kind, uint32_t value, const fb_zmq_msg_calls *z)
{
    fb_link *s = &t->at[link];
    if (s->gone) return;
    if (kind == FB_EVENT_GONE && s->resumable) {
        fb_links_detach(t, link);            /* it may come back: it lingers */
        return;
    }
    fb_links_reset(t, link, z);
    s->gone = 1;
    fb_links_event(t, kind, link, value);
}

/* -- a resumable session's resume ------------------------------------------ */

uint64_t fb_links_replay(fb_links *t, uint32_t link, uint64_t taken, const fb_zmq_msg_calls *z, uint64_t *lost)
{
    fb_link *s = &t->at[link];
    fb_qentry *head = NULL, *tail = NULL;
    uint64_t replayed = 0, gone = taken < s->ring.trimmed ? s->ring.trimmed - taken : 0;
    fb_ring_entry *r;
    while ((r = fb_ring_detach(&s->ring)) != NULL) {
        if (r->end > taken) {
            fb_qentry *e = r->buf ? fb_qentry_new(z, 3) : NULL;
            if (e && fb_qentry_frame(z, e, 0, FB_CMD_DATA_S, 1) == 0 && fb_qentry_frame(z, e, 1, r->seq, 8) == 0 &&
                    fb_qentry_own(z, e, 2, r->buf, r->len) == 0) {
                r->buf = NULL;                    /* the entry's now */
                e->records = r->records;
                replayed += r->records;
                if (tail) tail->next = e;
                else head = e;
                tail = e;
            } else {
                if (e) fb_qentry_free(z, e);
                gone += r->records;               /* a GAP kept, or no memory: announced as any loss */
            }
        }
        fb_ring_entry_free(r);
    }
    s->ring.trimmed = taken;                      /* (empty now: a resume from before is one GAP) */
    s->taken = taken;                             /* the stream counts on from what the client has */
    /* Ahead of what waited, in order. */
    if (head) {
        size_t bytes = 0;
        for (fb_qentry *e = head; e; e = e->next) bytes += e->size;
        tail->next = s->q.head;
        if (!s->q.head) s->q.tail = tail;
        s->q.head = head;
        s->q.bytes += bytes;
    }
    s->q.lost += gone;
    *lost = gone;
    return replayed;
}

/* -- the slow-consumer policy --------------------------------------------- */

void fb_links_ask_flow(fb_links *t)
{
    if (t->flow_asked) return;
    t->flow_asked = 1;
    fb_links_event(t, FB_EVENT_FLOW, 0, 0);
}

void fb_links_push(fb_links *t, uint32_t link, fb_qentry *e)
{
    fb_link *s = &t->at[link];
    fb_linkq_push(&s->q, e);
    if (t->flow_bytes && s->q.bytes > t->flow_bytes && !s->exempt && !s->holding && !s->detached) {
        s->holding = 1;
        t->nholding++;
        if (!t->paused) fb_links_ask_flow(t);
    }
}

int fb_links_release(fb_links *t, uint32_t link)
{
    fb_link *s = &t->at[link];
    if (!s->holding) return 0;
    s->holding = 0;
    t->nholding--;
    return 1;
}

void fb_links_exempt(fb_links *t, uint32_t link)
{
    if (fb_links_release(t, link)) t->at[link].exempt = 1;
}

void fb_links_drained(fb_links *t, uint32_t link)
{
    fb_link *s = &t->at[link];
    if (s->q.bytes > t->flow_bytes / 4) return;
    s->exempt = 0;
    fb_links_release(t, link);
}

int fb_links_enforce(fb_links *t, uint32_t link, const fb_zmq_msg_calls *z)
{
    fb_link *s = &t->at[link];
    if (s->q.bytes <= t->max_queue) return FB_KEPT;
    if (t->disconnect && s->session) return FB_KICK_SLOW;
    t->dropped_slow += fb_linkq_drop_data(z, &s->q, t->max_queue);
    if (s->q.bytes <= t->max_queue) return FB_KEPT;
    /* Still over: the newest batch is kept whatever its size; over with
     * control messages alone, the peer reads nothing at all. */
    size_t data = 0;
    for (const fb_qentry *e = s->q.head; e; e = e->next)
        if (e->records) data += e->size;
    if (s->q.bytes - data <= t->max_queue) return FB_KEPT;
    if (s->session) return FB_KICK_CONTROL;
    if (!s->overflowed) {
        s->overflowed = 1;
        fb_links_event(t, FB_EVENT_OVERFLOW, link, 0);
    }
    return FB_KEPT;
}
