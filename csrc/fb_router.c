/* fb_router.c - per-batch routing into per-link outboxes (see fb_router.h).
 *
 * (Over 700 lines because the router's parts (links and their outboxes,
 * glob subscriptions, queue groups, the per-batch delivery) share one
 * structure whose invariants the delivery relies on; the trie and the globs
 * it matches with are their own modules.)
 */
#include "fb_router.h"

#include <stdlib.h>
#include <string.h>

typedef struct linkbox {
    fb_outbox ob;
    uint64_t last_ns;      /* when its last batch was taken (if sent) */
    uint8_t active;
    uint8_t listed;        /* in r->pending */
    uint8_t listed_full;   /* in r->full */
    uint8_t held;          /* due only when full */
    uint8_t sent;          /* a batch was taken since the link was added */
    uint8_t no_headers;    /* its peer does not read headers: records go without them */
    uint8_t notify;        /* its requests that reach nobody are answered (fb_router_set_notify) */
    uint8_t away;          /* a queue group picks it last (fb_router_set_away) */
    uint8_t broker;        /* another broker: its records' groups were picked for there (fb_router_set_broker) */
    uint64_t stamp;        /* the last record appended (r->stamp): each record once */
} linkbox;

/* A glob subscription (fb_router_add_glob); pat NULL: free, and next the
 * next free slot. */
typedef struct globsub {
    unsigned char *pat;
    size_t len;
    uint32_t link;
    uint32_t next;
} globsub;

/* A queue group (fb_router_add_group); used 0: free, and next the next
 * free slot. */
typedef struct qgroup {
    unsigned char *pat;       /* a glob group's pattern, NULL: the trie's key decides */
    size_t len;
    uint32_t *members;
    uint32_t nmembers, capmembers;
    uint32_t cursor;          /* where the next pick starts (round robin) */
    uint32_t next;
    uint8_t used;
    uint8_t mark_len;         /* 0: no mark, this router's alone */
    unsigned char mark[FB_ROUTER_MARK_MAX];
    fb_backlog *held;         /* a held group's (fb_router_group_hold), NULL: not held */
    unsigned char *topic;     /* fb_router_set_group_topic's: records from bound channels go as this */
    size_t topic_len;
    uint32_t bound_capacity;  /* ... and what the backlog keeps of them (0: no count bound) */
} qgroup;

/* A group's pick of a broker link for the record being routed: the record
 * goes there once, naming every group that picked it (append_picked). */
typedef struct bpick {
    uint32_t link;
    uint32_t group;           /* index in r->groups */
} bpick;

struct fb_router {
    fb_outbox_limits lim;     /* of every outbox: no age limit (the linger is the router's) */
    uint64_t linger_ns;
    linkbox *links;
    uint32_t caplinks;
    uint32_t *pending;        /* links that may hold records: the only ones due() looks at */
    size_t npending, cappending;
    uint32_t *full;           /* links that route() filled, for fb_router_full */
    size_t nfull, capfull;
    fb_record *recs;
    size_t caprecs;
    fb_span *spans;
    size_t capspans;
    size_t *offsets;
    size_t capoffsets;
    fb_idvec ids;
    fb_record *notices;       /* this batch's no-responders replies, routed after it */
    bpick *picks;             /* the record's picks of broker links */
    size_t npicks, cappicks;
    unsigned char *hstrip;    /* the record's header block without the :groups it came with */
    size_t caphstrip;
    unsigned char *hbuf;      /* ... and with ours, for a broker link a group picked */
    size_t caphbuf;
    size_t nnotices, capnotices;
    globsub *globs;           /* by id - FB_ROUTER_GLOB_BASE */
    uint32_t nglobs, capglobs, freeglob, usedglobs;   /* freeglob UINT32_MAX: none free */
    qgroup *groups;           /* by id - FB_ROUTER_GROUP_BASE */
    uint32_t ngroups, capgroups, freegroup;           /* freegroup UINT32_MAX: none free */
    uint64_t stamp;           /* counts routed records: a link takes each once (linkbox.stamp) */
    size_t held_bytes;        /* what every held group's backlog costs (fb_backlog_cost) */
    size_t max_held_bytes;    /* fb_router_set_held_limit's bound of it, 0: none */
    int rec_held;             /* the record being routed: HELD_KEPT or HELD_FULL by a held group, else 0 */
    uint32_t rec_capacity;    /* ... and what its :hold allows a held group to keep (0: no count bound) */
    fb_router_held_fn held_fn; /* fb_router_set_held_hook's, NULL: none */
    void *held_arg;
    uint32_t catchall;        /* fb_router_set_catchall's link, UINT32_MAX: none */
    uint64_t catchall_from;
    fb_router_stats st;
};

fb_router *fb_router_new(const fb_outbox_limits *lim)
{
    fb_router *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (lim) {
        r->lim = *lim;
        r->linger_ns = lim->max_age_ns;
        r->lim.max_age_ns = 0;
    }
    fb_idvec_init(&r->ids);
    r->catchall = UINT32_MAX;
    r->freeglob = UINT32_MAX;
    r->freegroup = UINT32_MAX;
    return r;
}

void fb_router_free(fb_router *r)
{
    if (!r) return;
    for (uint32_t i = 0; i < r->caplinks; i++) fb_outbox_destroy(&r->links[i].ob);
    free(r->links);
    free(r->pending);
    free(r->full);
    free(r->recs);
    free(r->spans);
    free(r->offsets);
    free(r->notices);
    fb_idvec_free(&r->ids);
    for (uint32_t i = 0; i < r->nglobs; i++) free(r->globs[i].pat);
    free(r->globs);
    for (uint32_t i = 0; i < r->ngroups; i++) {
        free(r->groups[i].pat);
        free(r->groups[i].members);
        if (r->groups[i].held) fb_backlog_destroy(r->groups[i].held);
        free(r->groups[i].held);
    }
    free(r->groups);
    free(r->picks);
    free(r->hstrip);
    free(r->hbuf);
    free(r);
}

int fb_router_add_glob(fb_router *r, uint32_t link, const void *pattern, size_t len, uint64_t *id)
{
    if (link >= 0x80000000u || !id || (!pattern && len)) return FB_EINVAL;
    unsigned char *pat = malloc(len ? len : 1);
    if (!pat) return FB_ENOMEM;
    if (len) memcpy(pat, pattern, len);
    uint32_t i;
    if (r->freeglob != UINT32_MAX) {
        i = r->freeglob;
        r->freeglob = r->globs[i].next;
    } else {
        if (r->nglobs == r->capglobs) {
            uint32_t c = r->capglobs ? r->capglobs * 2 : 16;
            globsub *ng = c > r->capglobs ? realloc(r->globs, (size_t)c * sizeof *ng) : NULL;
            if (!ng) {
                free(pat);
                return FB_ENOMEM;
            }
            r->globs = ng;
            r->capglobs = c;
        }
        i = r->nglobs++;
    }
    r->globs[i] = (globsub){ pat, len, link, UINT32_MAX };
    r->usedglobs++;
    *id = FB_ROUTER_GLOB_BASE + i;
    return FB_OK;
}

int fb_router_remove_glob(fb_router *r, uint64_t id)
{
    if (id < FB_ROUTER_GLOB_BASE || id - FB_ROUTER_GLOB_BASE >= r->nglobs) return FB_ENOTFOUND;
    globsub *g = &r->globs[id - FB_ROUTER_GLOB_BASE];
    if (!g->pat) return FB_ENOTFOUND;
    free(g->pat);
    g->pat = NULL;
    g->next = r->freeglob;
    r->freeglob = (uint32_t)(id - FB_ROUTER_GLOB_BASE);
    r->usedglobs--;
    return FB_OK;
}

size_t fb_router_glob_count(const fb_router *r)
{
    return r->usedglobs;
}

/* -- queue groups -------------------------------------------------------------- */

static qgroup *group_of(const fb_router *r, uint64_t id)
{
    if (id < FB_ROUTER_GROUP_BASE || id - FB_ROUTER_GROUP_BASE >= r->ngroups) return NULL;
    qgroup *g = &r->groups[id - FB_ROUTER_GROUP_BASE];
    return g->used ? g : NULL;
}

int fb_router_add_group(fb_router *r, const void *pattern, size_t len, uint64_t *id)
{
    if (!id || (!pattern && len)) return FB_EINVAL;
    unsigned char *pat = NULL;
    if (pattern) {
        pat = malloc(len ? len : 1);
        if (!pat) return FB_ENOMEM;
        if (len) memcpy(pat, pattern, len);
    }
    uint32_t i;
    if (r->freegroup != UINT32_MAX) {
        i = r->freegroup;
        r->freegroup = r->groups[i].next;
    } else {
        if (r->ngroups == r->capgroups) {
            uint32_t c = r->capgroups ? r->capgroups * 2 : 16;
            qgroup *ng = c > r->capgroups ? realloc(r->groups, (size_t)c * sizeof *ng) : NULL;
            if (!ng) {
                free(pat);
                return FB_ENOMEM;
            }
            r->groups = ng;
            r->capgroups = c;
        }
        i = r->ngroups++;
    }
    r->groups[i] = (qgroup){ .pat = pat, .len = len, .next = UINT32_MAX, .used = 1 };
    *id = FB_ROUTER_GROUP_BASE + i;
    return FB_OK;
}

/* Tell the held hook (fb_router_set_held_hook) that a backlog changed. */
static void held_told(fb_router *r, const qgroup *g, int what, const fb_record *rec, uint64_t at_ns, size_t n)
{
    if (r->held_fn && g->mark_len && (what == FB_HELD_KEPT || n))
        r->held_fn(r->held_arg, g->mark, g->mark_len, what, rec, at_ns, n);
}

/* A group's backlog freed, and the group no longer held: how many records
 * it kept. */
static size_t free_backlog(fb_router *r, qgroup *g)
{
    r->held_bytes -= g->held->bytes;
    size_t n = fb_backlog_clear(g->held);
    held_told(r, g, FB_HELD_GONE, NULL, 0, n);
    fb_backlog_destroy(g->held);
    free(g->held);
    g->held = NULL;
    return n;
}

int fb_router_remove_group(fb_router *r, uint64_t id)
{
    qgroup *g = group_of(r, id);
    if (!g) return FB_ENOTFOUND;
    free(g->pat);
    free(g->members);
    free(g->topic);
    if (g->held) r->st.held_dropped += free_backlog(r, g);
    *g = (qgroup){ .next = r->freegroup };
    r->freegroup = (uint32_t)(id - FB_ROUTER_GROUP_BASE);
    return FB_OK;
}

int fb_router_group_join(fb_router *r, uint64_t id, uint32_t link)
{
    if (link >= 0x80000000u) return FB_EINVAL;
    qgroup *g = group_of(r, id);
    if (!g) return FB_ENOTFOUND;
    for (uint32_t i = 0; i < g->nmembers; i++)
        if (g->members[i] == link) return FB_OK;
    if (g->nmembers == g->capmembers) {
        uint32_t c = g->capmembers ? g->capmembers * 2 : 4;
        uint32_t *m = realloc(g->members, (size_t)c * sizeof *m);
        if (!m) return FB_ENOMEM;
        g->members = m;
        g->capmembers = c;
    }
    g->members[g->nmembers++] = link;
    return FB_OK;
}

int fb_router_group_leave(fb_router *r, uint64_t id, uint32_t link)
{
    qgroup *g = group_of(r, id);
    if (!g) return FB_ENOTFOUND;
    for (uint32_t i = 0; i < g->nmembers; i++) {
        if (g->members[i] != link) continue;
        /* (order kept: the round robin goes on where it was) */
        memmove(g->members + i, g->members + i + 1, (size_t)(g->nmembers - i - 1) * sizeof *g->members);
        g->nmembers--;
        if (g->cursor > i) g->cursor--;
        return FB_OK;
    }
    return FB_ENOTFOUND;
}

size_t fb_router_group_size(const fb_router *r, uint64_t id)
{
    const qgroup *g = group_of(r, id);
    return g ? g->nmembers : 0;
}

int fb_router_set_group_topic(fb_router *r, uint64_t id, const void *topic, size_t len, uint32_t capacity)
{
    qgroup *g = group_of(r, id);
    if (!g) return FB_ENOTFOUND;
    if (g->pat || (!topic && len)) return FB_EINVAL;
    unsigned char *t = NULL;
    if (topic) {
        if (!(t = malloc(len ? len : 1))) return FB_ENOMEM;
        if (len) memcpy(t, topic, len);
    }
    free(g->topic);
    g->topic = t;
    g->topic_len = t ? len : 0;
    g->bound_capacity = t ? capacity : 0;
    return FB_OK;
}

void fb_router_set_away(fb_router *r, uint32_t link, int away)
{
    if (link < r->caplinks && r->links[link].active) r->links[link].away = away != 0;
}

int fb_router_set_group_mark(fb_router *r, uint64_t id, const void *mark, size_t len)
{
    qgroup *g = group_of(r, id);
    if (!g) return FB_ENOTFOUND;
    if (!mark || len == 0 || len > FB_ROUTER_MARK_MAX) return FB_EINVAL;
    memcpy(g->mark, mark, len);
    g->mark_len = (uint8_t)len;
    return FB_OK;
}

void fb_router_set_broker(fb_router *r, uint32_t link, int broker)
{
    if (link < r->caplinks && r->links[link].active) r->links[link].broker = broker != 0;
}

int fb_router_group_hold(fb_router *r, uint64_t id)
{
    qgroup *g = group_of(r, id);
    if (!g) return FB_ENOTFOUND;
    if (g->held) return FB_OK;
    g->held = malloc(sizeof *g->held);
    if (!g->held) return FB_ENOMEM;
    fb_backlog_init(g->held);
    return FB_OK;
}

size_t fb_router_group_release(fb_router *r, uint64_t id)
{
    qgroup *g = group_of(r, id);
    return g && g->held ? free_backlog(r, g) : 0;
}

void fb_router_set_held_limit(fb_router *r, size_t max_bytes)
{
    r->max_held_bytes = max_bytes;
}

size_t fb_router_group_held(const fb_router *r, uint64_t id)
{
    const qgroup *g = group_of(r, id);
    return g && g->held ? fb_backlog_count(g->held) : 0;
}

size_t fb_router_held_bytes(const fb_router *r)
{
    return r->held_bytes;
}

size_t fb_router_group_expire(fb_router *r, uint64_t id, uint64_t before_ns)
{
    qgroup *g = group_of(r, id);
    if (!g || !g->held) return 0;
    size_t was = g->held->bytes, n = fb_backlog_expire(g->held, before_ns);
    r->held_bytes -= was - g->held->bytes;
    r->st.held_dropped += n;
    held_told(r, g, FB_HELD_GONE, NULL, 0, n);
    return n;
}

void fb_router_set_held_hook(fb_router *r, fb_router_held_fn fn, void *arg)
{
    r->held_fn = fn;
    r->held_arg = arg;
}

const fb_backlog *fb_router_group_backlog(const fb_router *r, uint64_t id)
{
    const qgroup *g = group_of(r, id);
    return g ? g->held : NULL;
}

int fb_router_group_restore(fb_router *r, uint64_t id, const fb_record *rec, uint64_t at_ns)
{
    qgroup *g = group_of(r, id);
    if (!g || !g->held) return FB_ENOTFOUND;
    size_t cost = fb_backlog_cost(rec);
    if (r->max_held_bytes && r->held_bytes + cost > r->max_held_bytes) return FB_ETOOBIG;
    int rc = fb_backlog_push(g->held, rec, at_ns);
    if (rc < 0) return rc;
    r->held_bytes += cost;
    return FB_OK;
}

/* The member of g a record from `source` goes to, or UINT32_MAX: the
 * first, from the cursor on, that is free (not held, not away), else
 * held, else away (fb_router.h). */
static uint32_t pick_member(fb_router *r, qgroup *g, uint64_t source)
{
    uint32_t best = UINT32_MAX, best_rank = 3, best_at = 0;
    for (uint32_t k = 0; k < g->nmembers; k++) {
        uint32_t at = (g->cursor + k) % g->nmembers;
        uint32_t m = g->members[at];
        if (m == source || m >= r->caplinks || !r->links[m].active) continue;
        uint32_t rank = r->links[m].away ? 2 : r->links[m].held ? 1 : 0;
        if (rank < best_rank) {
            best = m;
            best_rank = rank;
            best_at = at;
            if (rank == 0) break;
        }
    }
    if (best != UINT32_MAX) g->cursor = (best_at + 1) % g->nmembers;
    return best;
}

int fb_router_add_link(fb_router *r, uint32_t link)
{
    if (link >= 0x80000000u) return FB_EINVAL;
    if (link >= r->caplinks) {
        uint32_t c = r->caplinks ? r->caplinks : 16;
        while (c <= link) c *= 2;
        linkbox *nl = realloc(r->links, (size_t)c * sizeof *nl);
        if (!nl) return FB_ENOMEM;
        memset(nl + r->caplinks, 0, (size_t)(c - r->caplinks) * sizeof *nl);
        r->links = nl;
        r->caplinks = c;
    }
    linkbox *lb = &r->links[link];
    if (!lb->active) {
        fb_outbox_init(&lb->ob, &r->lim);
        lb->active = 1;
        lb->held = 0;
        lb->sent = 0;
        lb->no_headers = 0;
        lb->notify = 0;
        lb->away = 0;
        lb->broker = 0;
        lb->last_ns = 0;
    }
    return FB_OK;
}

void fb_router_set_headers(fb_router *r, uint32_t link, int keep, int again)
{
    if (link >= r->caplinks || !r->links[link].active) return;
    r->links[link].no_headers = !keep;
    fb_outbox_set_again(&r->links[link].ob, keep && again);
}

void fb_router_set_notify(fb_router *r, uint32_t link, int on)
{
    if (link < r->caplinks && r->links[link].active) r->links[link].notify = on != 0;
}

size_t fb_router_remove_link(fb_router *r, uint32_t link)
{
    if (link >= r->caplinks || !r->links[link].active) return 0;
    linkbox *lb = &r->links[link];
    size_t dropped = fb_outbox_count(&lb->ob);
    fb_outbox_destroy(&lb->ob);
    lb->active = 0;    /* stays listed until due() or full() passes over it */
    lb->held = 0;
    lb->sent = 0;
    return dropped;
}

int fb_router_has_link(const fb_router *r, uint32_t link)
{
    return link < r->caplinks && r->links[link].active;
}

static int list_link(fb_router *r, uint32_t link)
{
    linkbox *lb = &r->links[link];
    if (lb->listed) return FB_OK;
    if (r->npending == r->cappending) {
        size_t c = r->cappending ? r->cappending * 2 : 16;
        uint32_t *p = realloc(r->pending, c * sizeof *p);
        if (!p) return FB_ENOMEM;
        r->pending = p;
        r->cappending = c;
    }
    r->pending[r->npending++] = link;
    lb->listed = 1;
    return FB_OK;
}

/* A link whose outbox just became full, for fb_router_full.  Failing to
 * list it (ENOMEM) loses nothing: fb_router_due reports full outboxes too. */
static void list_full(fb_router *r, uint32_t link)
{
    linkbox *lb = &r->links[link];
    if (lb->listed_full) return;
    if (r->nfull == r->capfull) {
        size_t c = r->capfull ? r->capfull * 2 : 16;
        uint32_t *p = realloc(r->full, c * sizeof *p);
        if (!p) return;
        r->full = p;
        r->capfull = c;
    }
    r->full[r->nfull++] = link;
    lb->listed_full = 1;
}

void fb_router_touch(fb_router *r, uint32_t link)
{
    if (link < r->caplinks && r->links[link].active && fb_outbox_count(&r->links[link].ob)) {
        (void)list_link(r, link); /* on ENOMEM the outbox is still flushed by a later touch or route */
        if (fb_outbox_full(&r->links[link].ob)) list_full(r, link);
    }
}

static int reserve(void **p, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap) return FB_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    if (c > SIZE_MAX / item) return FB_ENOMEM;
    void *np = realloc(*p, c * item);
    if (!np) return FB_ENOMEM;
    *p = np;
    *cap = c;
    return FB_OK;
}

/* Append the record being routed to a link's outbox: 1 if appended, 0 if
 * the link has no outbox or already has this record, or an error. */
static int append_copy(fb_router *r, uint32_t id, const fb_record *rec, uint64_t now_ns);

static int append_to(fb_router *r, uint32_t id, const fb_record *rec, uint64_t now_ns)
{
    linkbox *lb = &r->links[id];
    if (!lb->active || lb->stamp == r->stamp) return 0;
    lb->stamp = r->stamp;
    return append_copy(r, id, rec, now_ns);
}

/* append_to without the "each link once": a copy under a group's own
 * topic (fb_router_set_group_topic) is another record for the link. */
static int append_copy(fb_router *r, uint32_t id, const fb_record *rec, uint64_t now_ns)
{
    linkbox *lb = &r->links[id];
    int rc;
    if (!lb->active) return 0;
    if (fb_outbox_count(&lb->ob) == 0 && (rc = list_link(r, id)) < 0) return rc;
    uint32_t hl = lb->no_headers ? 0 : rec->headers_len;
    rc = fb_outbox_append_h(&lb->ob, rec->topic, rec->topic_len, rec->headers, hl, rec->payload,
                            rec->payload_len, now_ns);
    if (rc < 0) return rc;
    if (rc == 1 && !lb->listed_full) list_full(r, id);
    return 1;
}

/* The blocks of the replies the router makes: one header, :status and a
 * three-digit code (fb_batch.h), by enum status. */
enum status { ST_DELIVERED, ST_KEPT, ST_NO_RESPONDERS, ST_FULL };
#define STATUS_BLOCK(code) { sizeof FB_HEADER_STATUS - 1, ':', 's', 't', 'a', 't', 'u', 's', 3, \
                             code[0], code[1], code[2] }
static const unsigned char STATUS[][12] = {
    STATUS_BLOCK(FB_STATUS_DELIVERED), STATUS_BLOCK(FB_STATUS_KEPT),
    STATUS_BLOCK(FB_STATUS_NO_RESPONDERS), STATUS_BLOCK(FB_STATUS_FULL),
};

/* A request answered by the router (nobody had it, or a held group's
 * outcome): its reply (topic: the reply channel, no payload, the :status)
 * is routed after the batch. */
static int add_notice(fb_router *r, const fb_record *rec, enum status st)
{
    const unsigned char *to;
    uint32_t tl;
    if (!fb_record_reply_to(rec, &to, &tl) || tl == 0) return FB_OK;
    int rc = reserve((void **)&r->notices, &r->capnotices, r->nnotices + 1, sizeof(fb_record));
    if (rc < 0) return rc;
    r->notices[r->nnotices++] = (fb_record){ to, NULL, tl, 0, STATUS[st], sizeof STATUS[st] };
    if (st == ST_NO_RESPONDERS) r->st.no_responders++;
    return FB_OK;
}

/* The record as it goes to every link but a broker a group picked: without
 * the :groups header it came with (in r->hstrip). */
static int strip_groups(fb_router *r, const fb_record *rec, uint32_t at, uint32_t span, fb_record *out)
{
    size_t rest = rec->headers_len - span;
    int rc = reserve((void **)&r->hstrip, &r->caphstrip, rest ? rest : 1, 1);
    if (rc < 0) return rc;
    if (at) memcpy(r->hstrip, rec->headers, at);
    if (rest > at) memcpy(r->hstrip + at, rec->headers + at + span, rest - at);
    *out = *rec;
    out->headers = rest ? r->hstrip : NULL;
    out->headers_len = (uint32_t)rest;
    return FB_OK;
}

/* r->picks[k]'s broker link gets the record, its :groups header naming
 * every group that picked that link (after :reply-to, which stays first);
 * with `only`, for those groups only (fb_batch.h). */
static int append_picked(fb_router *r, size_t k, const fb_record *plain, int only, uint64_t now_ns)
{
    static const unsigned char name[] = FB_HEADER_GROUPS;
    const uint32_t nl = sizeof name - 1, link = r->picks[k].link;
    uint32_t vlen = only ? 1 : 0;
    for (size_t q = k; q < r->npicks; q++)
        if (r->picks[q].link == link) {
            const qgroup *g = &r->groups[r->picks[q].group];
            vlen += (uint32_t)fb_varint_len(g->mark_len) + g->mark_len;
        }
    size_t hlen = fb_varint_len(nl) + nl + fb_varint_len(vlen) + vlen, first = 0;
    const unsigned char *to;
    uint32_t tl;
    if (plain->headers_len && fb_record_reply_to(plain, &to, &tl)) first = (size_t)(to + tl - plain->headers);
    size_t total = plain->headers_len + hlen;
    int rc = reserve((void **)&r->hbuf, &r->caphbuf, total, 1);
    if (rc < 0) return rc;
    unsigned char *p = r->hbuf;
    if (first) memcpy(p, plain->headers, first);
    p += first;
    p += fb_put_varint(p, nl);
    memcpy(p, name, nl);
    p += nl;
    p += fb_put_varint(p, vlen);
    if (only) *p++ = 0;                       /* the empty mark: for these groups only */
    for (size_t q = k; q < r->npicks; q++)
        if (r->picks[q].link == link) {
            const qgroup *g = &r->groups[r->picks[q].group];
            p += fb_put_varint(p, g->mark_len);
            memcpy(p, g->mark, g->mark_len);
            p += g->mark_len;
        }
    if (plain->headers_len > first) memcpy(p, plain->headers + first, plain->headers_len - first);
    fb_record d = *plain;
    d.headers = r->hbuf;
    d.headers_len = (uint32_t)total;
    return append_to(r, link, &d, now_ns);
}

/* The group trie id `id` stands for, if it is one that matches the record
 * (a glob group by its pattern) and, with `only`, one of only[0..nonly). */
static qgroup *matching_group(fb_router *r, uint64_t id, const fb_record *rec, const uint64_t *only, size_t nonly)
{
    if (id < FB_ROUTER_GROUP_BASE) return NULL;
    if (only) {
        size_t k = 0;
        while (k < nonly && only[k] != id) k++;
        if (k == nonly) return NULL;
    }
    qgroup *g = group_of(r, id);
    if (!g || (g->pat && fb_glob_match(g->pat, g->len, rec->topic, rec->topic_len) != 1)) return NULL;
    return g;
}

enum { HELD_KEPT = 1, HELD_FULL = 2 };

/* A held group without a member to take the record: keep it if the
 * sender's capacity (r->rec_capacity) and the router's bound allow;
 * r->rec_held says which. */
static int keep(fb_router *r, qgroup *g, const fb_record *rec, uint64_t now_ns, int bound)
{
    uint32_t capacity = r->rec_capacity;
    if (bound && g->bound_capacity && (!capacity || g->bound_capacity < capacity)) capacity = g->bound_capacity;
    size_t cost = fb_backlog_cost(rec);
    if ((capacity && fb_backlog_count(g->held) >= capacity) ||
        (r->max_held_bytes && r->held_bytes + cost > r->max_held_bytes)) {
        if (r->rec_held != HELD_KEPT) r->rec_held = HELD_FULL;
        r->st.held_full++;
        return FB_OK;
    }
    int rc = fb_backlog_push(g->held, rec, now_ns);
    if (rc < 0) return rc;
    r->held_bytes += cost;
    r->rec_held = HELD_KEPT;
    r->st.held_kept++;
    if (r->held_fn) {
        fb_record copy;                       /* (told the copy: one run of bytes) */
        fb_backlog_at(g->held, fb_backlog_count(g->held) - 1, &copy, NULL);
        held_told(r, g, FB_HELD_KEPT, &copy, now_ns, 1);
    }
    return FB_OK;
}

/* The groups a record matches (its trie ids r->ids.ids[from, to)): each
 * that is this broker's to pick for gives it to one member, a client at
 * once, a broker link by way of r->picks (then append_picked).  With
 * `only` (fb_router_route_groups) the groups in only[0..nonly), and the
 * record is for them only; *groups_only says whether it is (so for one
 * that came so from a broker: no plain subscriber gets it). */
static int pick_for_groups(fb_router *r, const fb_record *rec, const fb_record *plain, size_t from, size_t to,
                           uint64_t source, const uint64_t *only, size_t nonly, uint64_t now_ns,
                           uint64_t *delivered, int *groups_only)
{
    const unsigned char *marks = NULL;
    uint32_t marks_len = 0, at, span;
    int from_broker = !only && source < r->caplinks && r->links[source].broker;
    int named = from_broker && rec->headers_len && fb_record_groups(rec, &marks, &marks_len, &at, &span);
    uint64_t named_picked = 0;
    int rc;
    *groups_only = only != NULL || (named && fb_groups_only(marks, marks_len));
    r->npicks = 0;
    for (size_t j = from; j < to; j++) {
        uint64_t id = r->ids.ids[j];
        qgroup *g = matching_group(r, id, rec, only, nonly);
        if (!g) continue;
        /* From another broker: picked for there, unless it named us. */
        if (from_broker && g->mark_len && !(named && fb_groups_has(marks, marks_len, g->mark, g->mark_len)))
            continue;
        uint32_t m = pick_member(r, g, source);
        /* From a bound channel: the group's own copy, under its topic. */
        fb_record own;
        int bound = g->topic && (rec->topic_len != g->topic_len || memcmp(rec->topic, g->topic, g->topic_len));
        if (bound) {
            own = *plain;
            own.topic = g->topic;
            own.topic_len = (uint32_t)g->topic_len;
        }
        /* A held group keeps what only an away member could take: a
         * member that joins meanwhile gets it at once, and the away one
         * when it resumes (fb_router_group_give), rather than the record
         * waiting for that session's resume or expiry. */
        if (g->held && (m == UINT32_MAX || (m < r->caplinks && r->links[m].away))) {
            if (from_broker && g->mark_len) named_picked++;
            if ((rc = keep(r, g, bound ? &own : plain, now_ns, bound)) < 0) return rc;
            continue;
        }
        if (m == UINT32_MAX || m >= r->caplinks) continue;
        if (from_broker && g->mark_len) named_picked++;
        if (bound) {
            if ((rc = append_copy(r, m, &own, now_ns)) < 0) return rc;
            *delivered += (uint64_t)rc;
            continue;
        }
        if (r->links[m].broker && g->mark_len) {
            if ((rc = reserve((void **)&r->picks, &r->cappicks, r->npicks + 1, sizeof(bpick))) < 0) return rc;
            r->picks[r->npicks++] = (bpick){ m, (uint32_t)(id - FB_ROUTER_GROUP_BASE) };
        } else {
            if ((rc = append_to(r, m, plain, now_ns)) < 0) return rc;
            *delivered += (uint64_t)rc;
        }
    }
    if (named) {
        /* Named groups that picked nobody here (gone, or no member left):
         * what they were given is lost, and counted. */
        uint64_t n = fb_groups_count(marks, marks_len);
        if (n > named_picked) r->st.group_orphaned += n - named_picked;
    }
    for (size_t k = 0; k < r->npicks; k++) {
        size_t q = 0;
        while (q < k && r->picks[q].link != r->picks[k].link) q++;
        if (q < k) continue;                  /* (that link has it, naming this group too) */
        if ((rc = append_picked(r, k, plain, *groups_only, now_ns)) < 0) return rc;
        *delivered += (uint64_t)rc;
    }
    return FB_OK;
}

/* Match recs[0..n) in the trie in one pass and append each to the outbox
 * of every link that wants it but `source`, and to `all` (the catch-all
 * link, UINT32_MAX: none); *delivered counts the copies.  With `notify`,
 * a request that reached nobody gets its no-responders reply queued
 * (r->notices). */
/* The trie's ids for each of recs[0..n): record i's are r->ids.ids[
 * r->offsets[i], r->offsets[i + 1]). */
static int match_all(fb_router *r, fb_trie *t, const fb_record *recs, size_t n)
{
    int rc = reserve((void **)&r->spans, &r->capspans, n ? n : 1, sizeof(fb_span));
    if (rc == FB_OK) rc = reserve((void **)&r->offsets, &r->capoffsets, n + 1, sizeof(size_t));
    if (rc < 0) return rc;
    for (size_t i = 0; i < n; i++) {
        r->spans[i].ptr = recs[i].topic;
        r->spans[i].len = recs[i].topic_len;
    }
    fb_idvec_clear(&r->ids);
    return fb_trie_match_batch(t, r->spans, n, r->offsets, &r->ids);
}

/* The record without the :groups it came with (r->hstrip), or itself. */
static int without_groups(fb_router *r, const fb_record *rec, fb_record *stripped, const fb_record **plain)
{
    const unsigned char *marks;
    uint32_t marks_len, at, span;
    *plain = rec;
    if (rec->headers_len && fb_record_groups(rec, &marks, &marks_len, &at, &span)) {
        int rc = strip_groups(r, rec, at, span, stripped);
        if (rc < 0) return rc;
        *plain = stripped;
    }
    return FB_OK;
}

static int deliver(fb_router *r, fb_trie *t, const fb_record *recs, size_t n, uint64_t source, uint32_t all,
                   int notify, uint64_t now_ns, uint64_t *delivered)
{
    int rc = match_all(r, t, recs, n);
    if (rc < 0) return rc;
    for (size_t i = 0; i < n; i++) {
        const fb_record *rec = &recs[i];
        fb_record stripped;
        const fb_record *plain;                 /* what every link but a picked broker gets */
        if ((rc = without_groups(r, rec, &stripped, &plain)) < 0) return rc;
        /* A request to a held group is answered here: whoever gets it gets
         * it without its :reply-to and :hold. */
        uint32_t hend = 0;
        int hold = notify && plain == rec && rec->headers_len && fb_record_hold(rec, &r->rec_capacity, &hend);
        if (hold) {
            stripped = *rec;
            stripped.headers_len = rec->headers_len - hend;
            stripped.headers = stripped.headers_len ? rec->headers + hend : NULL;
            plain = &stripped;
        } else {
            r->rec_capacity = 0;
        }
        uint64_t before = *delivered;
        r->stamp++;                             /* append_to: each link once */
        r->rec_held = 0;
        /* Queue groups first: a broker link one picks gets the record
         * naming it, and the plain subscriptions below find it there. */
        int groups_only = 0;
        if (r->ngroups &&
            (rc = pick_for_groups(r, rec, plain, r->offsets[i], r->offsets[i + 1], source, NULL, 0, now_ns,
                                  delivered, &groups_only)) < 0)
            return rc;
        if (groups_only) continue;              /* (handed over: the plain subscribers had it) */
        for (size_t j = r->offsets[i]; j < r->offsets[i + 1]; j++) {
            uint64_t id = r->ids.ids[j];
            if (id >= FB_ROUTER_GROUP_BASE) {
                continue;                       /* (picked for above) */
            } else if (id >= FB_ROUTER_GLOB_BASE) {
                /* A glob held under a prefix of this topic: does it match? */
                uint64_t g = id - FB_ROUTER_GLOB_BASE;
                if (g >= r->nglobs || !r->globs[g].pat ||
                    fb_glob_match(r->globs[g].pat, r->globs[g].len, rec->topic, rec->topic_len) != 1)
                    continue;
                id = r->globs[g].link;
            }
            if (id == source || id >= r->caplinks) continue;
            if ((rc = append_to(r, (uint32_t)id, plain, now_ns)) < 0) return rc;
            *delivered += (uint64_t)rc;
        }
        if (all != UINT32_MAX) {                /* (a link that matched anyway has it: once) */
            if ((rc = append_to(r, all, plain, now_ns)) < 0) return rc;
            *delivered += (uint64_t)rc;
        }
        if (hold) {
            /* A request to a held group: answered whatever happened. */
            enum status st = r->rec_held == HELD_KEPT ? ST_KEPT : r->rec_held == HELD_FULL ? ST_FULL :
                             *delivered > before ? ST_DELIVERED : ST_NO_RESPONDERS;
            if ((rc = add_notice(r, rec, st)) < 0) return rc;
        } else if (*delivered == before && !r->rec_held && notify && rec->headers_len &&
                   (rc = add_notice(r, rec, ST_NO_RESPONDERS)) < 0) {
            return rc;
        }
        if (*delivered == before && !r->rec_held) r->st.unrouted++;
    }
    return FB_OK;
}

int fb_router_route(fb_router *r, fb_trie *t, const void *batch, size_t len,
                    const fb_decode_limits *lim, uint64_t source, uint64_t now_ns)
{
    uint32_t count;
    size_t n = 0, total;
    /* The decoder checks the structure (and max_records, the checksum);
     * record sizes are checked here, one record at a time. */
    fb_decode_limits shape = { 0, 0, 0, 0 };
    uint32_t max_topic = 0, max_payload = 0;
    if (lim) {
        shape = *lim;
        max_topic = lim->max_topic;
        max_payload = lim->max_payload;
        shape.max_topic = shape.max_payload = 0;
    }
    int rc = fb_batch_header(batch, len, &count, NULL);
    if (rc == FB_OK) {
        /* A count the buffer cannot hold is rejected by the decoder without
         * this router allocating for it first. */
        size_t cap = count <= len / 2 ? count : 0;
        rc = reserve((void **)&r->recs, &r->caprecs, cap ? cap : 1, sizeof(fb_record));
        if (rc == FB_OK) rc = fb_batch_decode(batch, len, &shape, cap ? r->recs : NULL, cap, &n);
    }
    if (rc < 0) {
        if (rc != FB_ENOMEM) r->st.rejected++;
        return rc;
    }
    total = n;
    if (max_topic || max_payload) {
        size_t w = 0;
        for (size_t i = 0; i < n; i++) {
            const fb_record *rec = &r->recs[i];
            if ((max_topic && rec->topic_len > max_topic) ||
                (max_payload && (uint64_t)rec->payload_len + rec->headers_len > max_payload))
                r->st.oversize++;
            else
                r->recs[w++] = *rec;
        }
        n = w;
    }
    uint64_t delivered = 0;
    /* The catch-all link, if its time has come and the batch is not its own. */
    uint32_t all = r->catchall;
    if (all == UINT32_MAX || now_ns < r->catchall_from || all == source || all >= r->caplinks ||
        !r->links[all].active)
        all = UINT32_MAX;
    int notify = source < r->caplinks && r->links[source].notify;
    r->nnotices = 0;
    if ((rc = deliver(r, t, r->recs, n, source, all, notify, now_ns, &delivered)) < 0) return rc;
    if (r->nnotices) {
        /* The requester's inbox is matched like any channel (its own link
         * included: no source), after the batch, so a reply never
         * overtakes records routed before it. */
        uint64_t d = 0;
        if ((rc = deliver(r, t, r->notices, r->nnotices, UINT64_MAX, UINT32_MAX, 0, now_ns, &d)) < 0) return rc;
        r->st.deliveries += d;
    }
    r->st.batches++;
    r->st.records += total;
    r->st.bytes += len;
    r->st.deliveries += delivered;
    return total > 0x7fffffff ? 0x7fffffff : (int)total;
}

/* Due at now_ns: full, or (unless held) idle for the linger. */
static int link_due(const fb_router *r, const linkbox *lb, uint64_t now_ns)
{
    if (fb_outbox_full(&lb->ob)) return 1;
    if (lb->held) return 0;
    if (!lb->sent || r->linger_ns == 0) return 1;
    return now_ns >= lb->last_ns && now_ns - lb->last_ns >= r->linger_ns;
}

/* Walk the pending list, dropping links that no longer hold records, and
 * report those that are due (or merely pending). */
static size_t scan(fb_router *r, uint64_t now_ns, int only_due, uint32_t *links, size_t cap)
{
    size_t out = 0, w = 0, i = 0;
    for (; i < r->npending && out < cap; i++) {
        uint32_t link = r->pending[i];
        linkbox *lb = &r->links[link];
        if (!lb->active || fb_outbox_count(&lb->ob) == 0) {
            lb->listed = 0;
            continue;
        }
        r->pending[w++] = link;
        if (!only_due || link_due(r, lb, now_ns)) links[out++] = link;
    }
    /* Keep whatever the cap left unvisited. */
    while (i < r->npending) r->pending[w++] = r->pending[i++];
    r->npending = w;
    return out;
}

size_t fb_router_due(fb_router *r, uint64_t now_ns, uint32_t *links, size_t cap)
{
    return scan(r, now_ns, 1, links, cap);
}

size_t fb_router_pending(fb_router *r, uint32_t *links, size_t cap)
{
    return scan(r, 0, 0, links, cap);
}

size_t fb_router_full(fb_router *r, uint32_t *links, size_t cap)
{
    size_t out = 0, i = 0, w = 0;
    for (; i < r->nfull && out < cap; i++) {
        uint32_t link = r->full[i];
        linkbox *lb = &r->links[link];
        lb->listed_full = 0;
        if (lb->active && fb_outbox_full(&lb->ob)) links[out++] = link;
    }
    while (i < r->nfull) r->full[w++] = r->full[i++];
    r->nfull = w;
    return out;
}

uint64_t fb_router_deadline(const fb_router *r)
{
    uint64_t d = UINT64_MAX;
    for (size_t i = 0; i < r->npending; i++) {
        const linkbox *lb = &r->links[r->pending[i]];
        if (!lb->active || fb_outbox_count(&lb->ob) == 0) continue;
        if (fb_outbox_full(&lb->ob)) return 0;
        if (lb->held) continue;
        if (!lb->sent || r->linger_ns == 0) return 0;
        uint64_t x = lb->last_ns > UINT64_MAX - r->linger_ns ? UINT64_MAX : lb->last_ns + r->linger_ns;
        if (x < d) d = x;
    }
    return d;
}

int fb_router_take(fb_router *r, uint32_t link, uint64_t now_ns, unsigned char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    if (link >= r->caplinks || !r->links[link].active) return FB_OK;
    linkbox *lb = &r->links[link];
    int rc = fb_outbox_take(&lb->ob, buf, len);
    if (rc == FB_OK && *buf) {
        lb->last_ns = now_ns;
        lb->sent = 1;
    }
    return rc;
}

void fb_router_hold(fb_router *r, uint32_t link, int held)
{
    if (link < r->caplinks && r->links[link].active) r->links[link].held = held != 0;
}

int fb_router_held(const fb_router *r, uint32_t link)
{
    return link < r->caplinks && r->links[link].active && r->links[link].held;
}

fb_outbox *fb_router_outbox(fb_router *r, uint32_t link)
{
    return link < r->caplinks && r->links[link].active ? &r->links[link].ob : NULL;
}

void fb_router_set_catchall(fb_router *r, uint32_t link, uint64_t from_ns)
{
    r->catchall = link;
    r->catchall_from = from_ns;
}

void fb_router_get_stats(const fb_router *r, fb_router_stats *s) { *s = r->st; }

/* Was this record (owed to `source`, whose trie ids are r->ids.ids[from,
 * to)) given it by one of the groups ids[0..nids)?  Sure only when it
 * names one (it came over a broker link that a group here picked), or
 * when `source` holds no other subscription that matches it and just one
 * of those groups does; otherwise it is not handed over (another member,
 * or the source's own subscription, had it: never twice). */
static int handed_for_groups(fb_router *r, const fb_record *rec, size_t from, size_t to, uint64_t source,
                             const uint64_t *ids, size_t nids)
{
    const unsigned char *marks;
    uint32_t marks_len, at, span;
    int named = rec->headers_len && fb_record_groups(rec, &marks, &marks_len, &at, &span);
    uint32_t groups = 0;
    for (size_t j = from; j < to; j++) {
        uint64_t id = r->ids.ids[j];
        if (id >= FB_ROUTER_GROUP_BASE) {
            qgroup *g = matching_group(r, id, rec, ids, nids);
            if (!g) continue;
            if (named && g->mark_len && fb_groups_has(marks, marks_len, g->mark, g->mark_len)) return 1;
            groups++;
        } else if (id >= FB_ROUTER_GLOB_BASE) {
            uint64_t gl = id - FB_ROUTER_GLOB_BASE;
            if (gl < r->nglobs && r->globs[gl].pat && r->globs[gl].link == source &&
                fb_glob_match(r->globs[gl].pat, r->globs[gl].len, rec->topic, rec->topic_len) == 1)
                return 0;
        } else if (id == source) {
            return 0;
        }
    }
    return !named && groups == 1;
}

int64_t fb_router_route_groups(fb_router *r, fb_trie *t, const void *batch, size_t len, size_t skip,
                               const uint64_t *ids, size_t nids, uint64_t source, uint64_t now_ns)
{
    uint32_t count;
    size_t n = 0;
    int rc = fb_batch_header(batch, len, &count, NULL);
    if (rc == FB_OK) {
        size_t cap = count <= len / 2 ? count : 0;
        rc = reserve((void **)&r->recs, &r->caprecs, cap ? cap : 1, sizeof(fb_record));
        if (rc == FB_OK) rc = fb_batch_decode(batch, len, NULL, cap ? r->recs : NULL, cap, &n);
    }
    if (rc < 0) return rc;
    if (skip >= n || !nids) return 0;
    const fb_record *recs = r->recs + skip;
    n -= skip;
    if ((rc = match_all(r, t, recs, n)) < 0) return rc;
    int64_t given = 0;
    uint64_t delivered = 0;
    for (size_t i = 0; i < n; i++) {
        fb_record stripped;
        const fb_record *plain;
        if (!handed_for_groups(r, &recs[i], r->offsets[i], r->offsets[i + 1], source, ids, nids)) continue;
        if ((rc = without_groups(r, &recs[i], &stripped, &plain)) < 0) return rc;
        uint64_t before = delivered;
        r->stamp++;
        r->rec_held = 0;
        r->rec_capacity = 0;
        int groups_only;
        rc = pick_for_groups(r, &recs[i], plain, r->offsets[i], r->offsets[i + 1], source, ids, nids, now_ns,
                             &delivered, &groups_only);
        if (rc < 0) return rc;
        if (delivered > before || r->rec_held == HELD_KEPT) given++;
    }
    r->st.deliveries += delivered;
    return given;
}

int64_t fb_router_group_give(fb_router *r, uint64_t id, uint64_t now_ns)
{
    qgroup *g = group_of(r, id);
    if (!g || !g->held) return 0;
    int64_t given = 0;
    int rc = FB_OK;
    fb_record rec;
    while (fb_backlog_peek(g->held, &rec, NULL)) {
        uint32_t m = pick_member(r, g, UINT64_MAX);
        if (m == UINT32_MAX || m >= r->caplinks || r->links[m].away) break;
        r->stamp++;
        if (r->links[m].broker && g->mark_len) {
            /* Another broker's members: the record names the group, for
             * that broker to pick one of them (and only them). */
            if ((rc = reserve((void **)&r->picks, &r->cappicks, 1, sizeof(bpick))) < 0) break;
            r->picks[0] = (bpick){ m, (uint32_t)(id - FB_ROUTER_GROUP_BASE) };
            r->npicks = 1;
            rc = append_picked(r, 0, &rec, 1, now_ns);
        } else {
            rc = append_to(r, m, &rec, now_ns);
        }
        if (rc <= 0) break;                   /* (an error, or not taken: it stays) */
        size_t was = g->held->bytes;
        fb_backlog_pop(g->held);
        r->held_bytes -= was - g->held->bytes;
        r->st.held_given++;
        r->st.deliveries += (uint64_t)rc;
        given++;
    }
    held_told(r, g, FB_HELD_GONE, NULL, 0, (size_t)given);
    return rc < 0 ? rc : given;
}
