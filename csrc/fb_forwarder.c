/*
 * fb_forwarder.c - minimal upstream diffs from downstream (un)subscriptions.
 *
 * U is the set upstream should hold uncollapsed.  Dedup mode: every held
 * (key, kind).  Subsume mode: every held (key, kind) not covered by another
 * held prefix key (fb_trie_covered).  U is never stored: it is implied by the
 * trie of downstream keys, and only its size is tracked (f->nup).
 *
 * Each public call runs one or more elementary transitions ("this key got its
 * first holder", "this key lost its last holder"), each appending the change
 * of U to f->scratch as subscribes followed by unsubscribes.  finish() then
 * emits the scratch, or replaces it by a collapse to "" or an expansion from
 * "" when the cap is crossed.
 */
#include "fb_forwarder.h"

#include <stdlib.h>
#include <string.h>

struct fb_forwarder {
    fb_trie *t;
    int owns_trie;        /* 0: fb_forwarder_new_over's, the caller's table */
    fb_forwarder_mode mode;
    size_t cap, cap_low;
    size_t nup;
    int collapsed;
    fb_keylist scratch;   /* U's change during the current call */
    fb_keylist tmp;       /* a peer's keys, or an enumeration of U */
};

fb_forwarder *fb_forwarder_new_over(fb_trie *t, fb_forwarder_mode mode, size_t cap, size_t cap_low)
{
    if (!t) return NULL;
    if (mode != FB_FWD_DEDUP && mode != FB_FWD_SUBSUME) return NULL;
    if (cap_low > cap) return NULL;
    fb_forwarder *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->t = t;
    f->mode = mode;
    f->cap = cap;
    f->cap_low = cap_low;
    fb_keylist_init(&f->scratch);
    fb_keylist_init(&f->tmp);
    return f;
}

fb_forwarder *fb_forwarder_new(fb_forwarder_mode mode, size_t cap, size_t cap_low)
{
    fb_trie *t = fb_trie_new();
    if (!t) return NULL;
    fb_forwarder *f = fb_forwarder_new_over(t, mode, cap, cap_low);
    if (!f) { fb_trie_free(t); return NULL; }
    f->owns_trie = 1;
    return f;
}

void fb_forwarder_free(fb_forwarder *f)
{
    if (!f) return;
    if (f->owns_trie) fb_trie_free(f->t);
    fb_keylist_free(&f->scratch);
    fb_keylist_free(&f->tmp);
    free(f);
}

/* The scratch lists keep their buffers from call to call, so that the
 * common event allocates nothing.  One that a big call grew (a peer with a
 * million keys leaving, a collapse) is freed instead of holding that much
 * memory for good. */
#define SCRATCH_KEEP ((size_t)64 * 1024)

static void trim_list(fb_keylist *l)
{
    if (l->capbytes + l->cap * sizeof(fb_keyent) > SCRATCH_KEEP) fb_keylist_free(l);
}

static void trim_scratch(fb_forwarder *f)
{
    trim_list(&f->scratch);
    trim_list(&f->tmp);
}

static inline uint32_t kl_flags(int sub, int kind)
{
    return (sub ? FB_KL_SUBSCRIBE : 0u) | (kind == FB_PREFIX ? FB_KL_PREFIX : 0u);
}

/* Walk contexts for the subtree below a prefix key that was just added
 * (hide: its keys leave U) or just removed (uncover: they enter U). */
typedef struct subtree_ctx {
    fb_forwarder *f;
    size_t keylen;   /* length of the prefix key being added or removed */
    int subscribe;   /* 1: uncover, 0: hide */
} subtree_ctx;

static int subtree_cb(void *vctx, const unsigned char *key, size_t len, uint32_t ex, uint32_t px)
{
    subtree_ctx *c = vctx;
    fb_forwarder *f = c->f;
    int rc;
    if (len > c->keylen && px) {
        /* A deeper held prefix: it is (un)covered, and it covers everything
         * below it, including the exact key with the same bytes. */
        rc = fb_keylist_push(&f->scratch, kl_flags(c->subscribe, FB_PREFIX), 0, key, len);
        if (rc < 0) return rc;
        if (c->subscribe) f->nup++; else f->nup--;
        return FB_WALK_SKIP;
    }
    if (ex) {
        /* An exact key at the prefix's own node, or below it with no closer cover. */
        rc = fb_keylist_push(&f->scratch, kl_flags(c->subscribe, FB_EXACT), 0, key, len);
        if (rc < 0) return rc;
        if (c->subscribe) f->nup++; else f->nup--;
    }
    return FB_WALK_NEXT;
}

/* (key, kind) just got its first downstream holder. */
static int on_first(fb_forwarder *f, const unsigned char *key, size_t len, int kind)
{
    if (f->mode == FB_FWD_SUBSUME && fb_trie_covered(f->t, key, len, kind)) return FB_OK;
    int rc = fb_keylist_push(&f->scratch, kl_flags(1, kind), 0, key, len);
    if (rc < 0) return rc;
    f->nup++;
    if (f->mode == FB_FWD_SUBSUME && kind == FB_PREFIX) {
        subtree_ctx c = { f, len, 0 };
        rc = fb_trie_walk(f->t, key, len, subtree_cb, &c);
        if (rc < 0) return rc;
    }
    return FB_OK;
}

/* (key, kind) just lost its last downstream holder (already removed). */
static int on_last(fb_forwarder *f, const unsigned char *key, size_t len, int kind)
{
    if (f->mode == FB_FWD_SUBSUME && fb_trie_covered(f->t, key, len, kind)) return FB_OK;
    f->nup--;
    if (f->mode == FB_FWD_SUBSUME && kind == FB_PREFIX) {
        /* Subscribe what the cover hid before unsubscribing the cover. */
        subtree_ctx c = { f, len, 1 };
        int rc = fb_trie_walk(f->t, key, len, subtree_cb, &c);
        if (rc < 0) return rc;
    }
    return fb_keylist_push(&f->scratch, kl_flags(0, kind), 0, key, len);
}

/* Enumerate U into a key list as subscribe entries. */
typedef struct up_ctx { fb_forwarder_mode mode; fb_keylist *out; } up_ctx;

static int upstream_cb(void *vctx, const unsigned char *key, size_t len, uint32_t ex, uint32_t px)
{
    up_ctx *c = vctx;
    int rc;
    if (c->mode == FB_FWD_SUBSUME && px) {
        /* A held prefix covers its own exact key and everything below. */
        rc = fb_keylist_push(c->out, kl_flags(1, FB_PREFIX), 0, key, len);
        return rc < 0 ? rc : FB_WALK_SKIP;
    }
    if (ex && (rc = fb_keylist_push(c->out, kl_flags(1, FB_EXACT), 0, key, len)) < 0) return rc;
    if (px && (rc = fb_keylist_push(c->out, kl_flags(1, FB_PREFIX), 0, key, len)) < 0) return rc;
    return FB_WALK_NEXT;
}

static int enumerate_upstream(const fb_forwarder *f, fb_keylist *out)
{
    up_ctx c = { f->mode, out };
    return fb_trie_walk(f->t, NULL, 0, upstream_cb, &c);
}

/* Count U (a walk as enumerate_upstream's, nothing copied). */
typedef struct count_ctx { fb_forwarder_mode mode; size_t n; } count_ctx;

static int count_cb(void *vctx, const unsigned char *key, size_t len, uint32_t ex, uint32_t px)
{
    (void)key; (void)len;
    count_ctx *c = vctx;
    if (c->mode == FB_FWD_SUBSUME && px) {
        c->n++;
        return FB_WALK_SKIP;
    }
    c->n += (ex != 0) + (px != 0);
    return FB_WALK_NEXT;
}

static inline int is_all(const fb_keyent *e) { return e->len == 0 && (e->flags & FB_KL_PREFIX); }

typedef struct keyref { const unsigned char *p; size_t len; uint32_t kind; } keyref;

static int keyref_cmp(const void *a, const void *b)
{
    const keyref *x = a, *y = b;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    size_t m = x->len < y->len ? x->len : y->len;
    int c = m ? memcmp(x->p, y->p, m) : 0;
    if (c) return c;
    return x->len < y->len ? -1 : (x->len > y->len);
}

static const unsigned char EMPTY[1] = { 0 };

/* Collapse: upstream holds U_before = (U_after - scratch subs) + scratch
 * unsubs; move it to {""}: subscribe "" first, then unsubscribe the rest. */
static int collapse(fb_forwarder *f, fb_keylist *diff)
{
    fb_keylist_clear(&f->tmp);
    int rc = enumerate_upstream(f, &f->tmp);
    if (rc < 0) return rc;
    size_t nsubs = 0;
    for (size_t i = 0; i < f->scratch.n; i++) nsubs += (f->scratch.ents[i].flags & FB_KL_SUBSCRIBE) != 0;
    keyref *subs = malloc((nsubs ? nsubs : 1) * sizeof *subs);
    if (!subs) return FB_ENOMEM;
    size_t k = 0;
    int all_before = 0;
    for (size_t i = 0; i < f->scratch.n; i++) {
        const fb_keyent *e = &f->scratch.ents[i];
        if (e->flags & FB_KL_SUBSCRIBE)
            subs[k++] = (keyref){ fb_keylist_key(&f->scratch, i), e->len, e->flags & FB_KL_PREFIX };
        else if (is_all(e))
            all_before = 1;
    }
    qsort(subs, nsubs, sizeof *subs, keyref_cmp);
    for (size_t i = 0; i < f->tmp.n; i++) {
        const fb_keyent *e = &f->tmp.ents[i];
        keyref q = { fb_keylist_key(&f->tmp, i), e->len, e->flags & FB_KL_PREFIX };
        if (is_all(e) && !bsearch(&q, subs, nsubs, sizeof *subs, keyref_cmp)) all_before = 1;
    }
    size_t mark = diff->n, markb = diff->nbytes;
    if (!all_before && (rc = fb_keylist_push(diff, FB_KL_SUBSCRIBE | FB_KL_PREFIX, 0, EMPTY, 0)) < 0)
        goto fail;
    for (size_t i = 0; i < f->scratch.n; i++) {
        const fb_keyent *e = &f->scratch.ents[i];
        if ((e->flags & FB_KL_SUBSCRIBE) || is_all(e)) continue;
        rc = fb_keylist_push(diff, e->flags, 0, fb_keylist_key(&f->scratch, i), e->len);
        if (rc < 0) goto fail;
    }
    for (size_t i = 0; i < f->tmp.n; i++) {
        const fb_keyent *e = &f->tmp.ents[i];
        if (is_all(e)) continue;
        keyref q = { fb_keylist_key(&f->tmp, i), e->len, e->flags & FB_KL_PREFIX };
        if (bsearch(&q, subs, nsubs, sizeof *subs, keyref_cmp)) continue;
        rc = fb_keylist_push(diff, e->flags & FB_KL_PREFIX, 0, q.p, q.len);
        if (rc < 0) goto fail;
    }
    free(subs);
    f->collapsed = 1;
    return FB_OK;
fail:
    free(subs);
    diff->n = mark;
    diff->nbytes = markb;
    return rc;
}

/* Expand: upstream holds {""}; subscribe U, then drop "" unless it is in U. */
static int expand(fb_forwarder *f, fb_keylist *diff)
{
    fb_keylist_clear(&f->tmp);
    int rc = enumerate_upstream(f, &f->tmp);
    if (rc < 0) return rc;
    size_t mark = diff->n, markb = diff->nbytes;
    int all_in_u = 0;
    for (size_t i = 0; i < f->tmp.n; i++) {
        const fb_keyent *e = &f->tmp.ents[i];
        if (is_all(e)) { all_in_u = 1; continue; }
        rc = fb_keylist_push(diff, e->flags, 0, fb_keylist_key(&f->tmp, i), e->len);
        if (rc < 0) goto fail;
    }
    if (!all_in_u && (rc = fb_keylist_push(diff, FB_KL_PREFIX, 0, EMPTY, 0)) < 0) goto fail;
    f->collapsed = 0;
    return FB_OK;
fail:
    diff->n = mark;
    diff->nbytes = markb;
    return rc;
}

/* The diff an event built in scratch, appended to the caller's.  Into an
 * empty diff (the usual case) the buffers change hands instead of being
 * copied: a peer that leaves with 64 MiB of keys makes a diff that size,
 * and a copy of it would double the broker's peak. */
static int hand_over(fb_keylist *diff, fb_keylist *scratch)
{
    if (diff->n != 0) return fb_keylist_extend(diff, scratch);
    fb_keylist spare = *diff;
    *diff = *scratch;
    *scratch = spare;
    fb_keylist_clear(scratch);
    return FB_OK;
}

static int finish(fb_forwarder *f, fb_keylist *diff)
{
    if (f->cap && !f->collapsed && f->nup > f->cap) return collapse(f, diff);
    if (f->cap && f->collapsed) return f->nup <= f->cap_low ? expand(f, diff) : FB_OK;
    return hand_over(diff, &f->scratch);
}

/* One downstream event: change the trie, then derive U's change.  On error
 * the trie change is undone, so a failed call leaves no trace. */
static int fwd_event(fb_forwarder *f, int subscribe, uint64_t peer, const void *key, size_t len,
                     int kind, fb_keylist *diff)
{
    fb_keylist_clear(&f->scratch);
    size_t nup = f->nup;
    int rc = subscribe ? fb_trie_add(f->t, key, len, kind, peer) : fb_trie_remove(f->t, key, len, kind, peer);
    if (rc <= 0) return rc;
    rc = subscribe ? on_first(f, key, len, kind) : on_last(f, key, len, kind);
    if (rc == FB_OK) rc = finish(f, diff);
    if (rc < 0) {
        if (subscribe) fb_trie_remove(f->t, key, len, kind, peer);
        else fb_trie_add(f->t, key, len, kind, peer);
        f->nup = nup;
        return rc;
    }
    return 1;
}

int fb_forwarder_subscribe(fb_forwarder *f, uint64_t peer, const void *key, size_t len, int kind,
                     fb_keylist *diff)
{
    int rc = fwd_event(f, 1, peer, key, len, kind, diff);
    trim_scratch(f);
    return rc;
}

int fb_forwarder_unsubscribe(fb_forwarder *f, uint64_t peer, const void *key, size_t len, int kind,
                       fb_keylist *diff)
{
    int rc = fwd_event(f, 0, peer, key, len, kind, diff);
    trim_scratch(f);
    return rc;
}

typedef struct order { size_t len; uint32_t kind; size_t idx; } order;

/* Longest keys first; at equal length exact before prefix.  Then a key is
 * released while every shorter key of the peer is still held, so nothing it
 * uncovers is unsubscribed again later: the diff is minimal. */
static int order_cmp(const void *a, const void *b)
{
    const order *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

/* Release up to max_bytes of the peer's keys (0: all of them), longest
 * first; append the change of U to diff.  Returns how many keys went (the
 * peer's reference counts aside), or < 0. */
static int remove_keys(fb_forwarder *f, uint64_t peer, fb_keylist *diff, size_t max_bytes)
{
    fb_keylist_clear(&f->scratch);
    fb_keylist_clear(&f->tmp);
    int rc = fb_trie_subscriber_keys_some(f->t, peer, &f->tmp, max_bytes);
    if (rc < 0) return rc;
    size_t n = f->tmp.n;
    if (n == 0) return 0;
    order *ord = malloc(n * sizeof *ord);
    if (!ord) return FB_ENOMEM;
    for (size_t i = 0; i < n; i++)
        ord[i] = (order){ f->tmp.ents[i].len, f->tmp.ents[i].flags & FB_KL_PREFIX, i };
    qsort(ord, n, sizeof *ord, order_cmp);
    /* tmp is reused by collapse/expand in finish(): the keys leave it first
     * (its buffers change hands; no copy of what may be many long keys). */
    fb_keylist keys = f->tmp;
    fb_keylist_init(&f->tmp);
    for (size_t i = 0; i < n && rc >= 0; i++) {
        const fb_keyent *e = &keys.ents[ord[i].idx];
        const unsigned char *k = fb_keylist_key(&keys, ord[i].idx);
        int kind = (e->flags & FB_KL_PREFIX) ? FB_PREFIX : FB_EXACT;
        int last = 0;
        for (uint32_t r = 0; r < e->count && rc >= 0; r++) {
            rc = fb_trie_remove(f->t, k, e->len, kind, peer);
            if (rc == 1) last = 1;
        }
        if (rc >= 0 && last) rc = on_last(f, k, e->len, kind);
    }
    int frc = finish(f, diff);
    free(ord);
    fb_keylist_free(&keys);
    trim_scratch(f);
    if (rc < 0) return rc;
    if (frc < 0) return frc;
    return n > 0x7fffffff ? 0x7fffffff : (int)n;
}

int fb_forwarder_remove_peer(fb_forwarder *f, uint64_t peer, fb_keylist *diff)
{
    return remove_keys(f, peer, diff, 0);
}

int fb_forwarder_remove_peer_some(fb_forwarder *f, uint64_t peer, fb_keylist *diff, size_t max_bytes)
{
    if (max_bytes == 0) return FB_EINVAL;
    int rc = remove_keys(f, peer, diff, max_bytes);
    return rc < 0 ? rc : rc > 0;
}

int fb_forwarder_drop_peer(fb_forwarder *f, uint64_t peer)
{
    int rc = fb_trie_remove_subscriber(f->t, peer, NULL);
    if (rc < 0) return rc;
    count_ctx c = { f->mode, 0 };
    int wrc = fb_trie_walk(f->t, NULL, 0, count_cb, &c);
    if (wrc < 0) return wrc;
    f->nup = c.n;
    if (f->cap && f->collapsed && f->nup <= f->cap_low) f->collapsed = 0;
    else if (f->cap && !f->collapsed && f->nup > f->cap) f->collapsed = 1;
    return rc;
}

int fb_forwarder_snapshot(const fb_forwarder *f, fb_keylist *out)
{
    if (f->collapsed) return fb_keylist_push(out, FB_KL_SUBSCRIBE | FB_KL_PREFIX, 0, EMPTY, 0);
    int rc = enumerate_upstream(f, out);
    return rc < 0 ? rc : FB_OK;
}

size_t fb_forwarder_upstream_count(const fb_forwarder *f) { return f->nup; }
int fb_forwarder_collapsed(const fb_forwarder *f) { return f->collapsed; }
fb_forwarder_mode fb_forwarder_get_mode(const fb_forwarder *f) { return f->mode; }
const fb_trie *fb_forwarder_trie(const fb_forwarder *f) { return f->t; }
