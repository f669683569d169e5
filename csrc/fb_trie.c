/*
 * fb_trie.c - path-compressed radix trie with reference-counted subscriptions.
 *
 * Layout of a node (one arena block, see fb_arena.h):
 *
 *   node header (12 B)  parent ref, segment length, child count, flags
 *   [hset EXACT]  12 B  present if NF_EXACT
 *   [hset PREFIX] 12 B  present if NF_PREFIX
 *   child refs          4 B each, ordered by label
 *   labels              1 B each: the first byte of each child's segment
 *   segment             the bytes of the edge from the parent to this node
 *
 * The key of a node is the concatenation of the segments from the root (whose
 * segment is empty) down to it.  Every non-root node has a segment of at least
 * one byte whose first byte is its label in the parent.  Canonical form: a
 * non-root node without holders has at least two children (else it is merged
 * into its child or deleted).
 *
 * A holder set (hset) is one inline holder {slot, refs, subpos} or, from two
 * holders on, an arena array of them.  `slot` is the dense index of the
 * subscriber (the 64-bit ids map to slots through a hash table); `subpos` is
 * the position of the matching entry in that subscriber's index, an arena
 * array of {node ref, holder position, kind}.  Holder and index entry point at
 * each other, so removing either side is O(1) by swap-remove, and
 * remove_subscriber walks only the subscriber's own index.
 *
 * Nodes move whenever their size changes (a child or holder set added or
 * removed, a segment split or merged).  relink() then patches every reference
 * to the node: the parent's child slot, the children's parent refs and the
 * index entries of its holders.  This is the price of parent refs, which buy
 * remove_subscriber its independence from the size of the table.
 *
 * Nothing recurses: walks keep an explicit stack on the heap.
 *
 * (One file of 1,300 lines because the nodes, the holder sets, the
 * per-subscriber index and relink() keep one invariant between them, which
 * fb_trie_check verifies: split, each part would reach into the others'
 * layout.  The arena is its own file, fb_arena.c.)
 *
 * (Over 700 lines because the trie's operations (add, remove, match, a
 * batch's match, walks) all keep the canonical form and the holder/index
 * links described here, which must be read together.)
 */
#include "fb_trie.h"
#include "fb_arena.h"

#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ------------------------------------------------------------------------ */
/* Layout                                                                     */

typedef struct node {
    fb_ref parent;
    uint32_t seglen;
    uint16_t nchild;
    uint8_t flags;
    uint8_t pad;
} node;

#define HDR 12u
#define HSET 12u
#define NF_EXACT 0x1u
#define NF_PREFIX 0x2u
#define NF_EXACT_MANY 0x4u
#define NF_PREFIX_MANY 0x8u
#define NF_ANY (NF_EXACT | NF_PREFIX)

/* The node flag saying a holder set of this kind (0 exact, 1 prefix) is
 * present, and the one saying it is an array (more than one holder). */
static inline uint8_t kind_flag(int kind) { return kind ? NF_PREFIX : NF_EXACT; }
static inline uint8_t kind_many_flag(int kind) { return kind ? NF_PREFIX_MANY : NF_EXACT_MANY; }

typedef struct holder { uint32_t slot, refs, subpos; } holder;
typedef struct hmany { fb_ref arr; uint32_t n, cap; } hmany;
typedef union hset { holder one; hmany many; } hset;

typedef struct subent { fb_ref node; uint32_t pos_kind; } subent; /* pos << 1 | kind */

typedef struct slot {
    uint64_t id;
    uint32_t epoch;   /* last match that reported this subscriber */
    uint32_t nkeys;   /* entries in index */
    uint32_t cap;     /* index capacity; SLOT_FREE when the slot is unused */
    fb_ref index;     /* arena array of subent; next free slot (1-based) when free */
} slot;
#define SLOT_FREE UINT32_MAX
#define HEMPTY UINT32_MAX

struct fb_trie {
    fb_arena a;
    fb_ref root;
    size_t nkeys, nsubs, nnodes;
    slot *slots;
    uint32_t nslots, capslots, freeslot, liveslots;
    uint64_t *hkeys;           /* open addressing, linear probing, id -> slot */
    uint32_t *hvals;
    uint32_t hcap, hcount;
    uint32_t epoch;
    unsigned char *kbuf;       /* scratch for rebuilding keys */
    size_t kcap;
    struct hit *hits;          /* scratch for fb_trie_match_batch */
    size_t hcap_hits;
};

_Static_assert(sizeof(node) == HDR, "node header is 12 bytes");
_Static_assert(sizeof(hset) == HSET, "holder set is 12 bytes");

/* The node a ref names. */
static inline node *node_at(const fb_trie *t, fb_ref r) { return (node *)fb_arena_ptr(&t->a, r); }
static inline unsigned nsets(unsigned f) { return ((f & NF_EXACT) != 0) + ((f & NF_PREFIX) != 0); }
static inline size_t node_bytes(unsigned flags, size_t nchild, size_t seglen)
{
    return HDR + HSET * nsets(flags) + 5 * nchild + seglen;
}
static inline size_t node_size(const node *n) { return node_bytes(n->flags, n->nchild, n->seglen); }
static inline hset *n_hset(node *n, int kind)
{
    unsigned char *p = (unsigned char *)n + HDR;
    if (kind == FB_PREFIX && (n->flags & NF_EXACT)) p += HSET;
    return (hset *)p;
}
static inline fb_ref *n_children(node *n)
{
    return (fb_ref *)((unsigned char *)n + HDR + HSET * nsets(n->flags));
}
static inline unsigned char *n_labels(node *n) { return (unsigned char *)(n_children(n) + n->nchild); }
static inline unsigned char *n_seg(node *n) { return n_labels(n) + n->nchild; }

static inline int child_index(node *n, unsigned char b)
{
    const unsigned char *l = n_labels(n);
    uint32_t nc = n->nchild;
    if (nc <= 16) {
#if defined(__SSE2__)
        /* Compare all (up to 16) labels at once: no data-dependent loop exit
         * to mispredict.  The load may read past the node, never past its
         * allocation (FB_ARENA_SLACK); the extra lanes are masked off. */
        if (nc) {
            __m128i v = _mm_loadu_si128((const __m128i *)l);
            unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8((char)b)));
            m &= (1u << nc) - 1u;
            return m ? __builtin_ctz(m) : -1;
        }
        return -1;
#else
        for (uint32_t i = 0; i < nc; i++)
            if (l[i] == b) return (int)i;
        return -1;
#endif
    }
    const unsigned char *p = memchr(l, b, nc);
    return p ? (int)(p - l) : -1;
}

/* Does the node's segment equal k[0..seglen)?  (Caller checked the length.) */
static inline int seg_equal(node *n, const unsigned char *k)
{
    const unsigned char *s = n_seg(n);
    uint32_t len = n->seglen;
    if (len <= 16) {
        for (uint32_t i = 0; i < len; i++)
            if (s[i] != k[i]) return 0;
        return 1;
    }
    return memcmp(s, k, len) == 0;
}

static inline uint32_t hs_count(node *n, int kind)
{
    if (!(n->flags & kind_flag(kind))) return 0;
    if (n->flags & kind_many_flag(kind)) return n_hset(n, kind)->many.n;
    return 1;
}

static inline holder *hs_get(const fb_trie *t, node *n, int kind, uint32_t i)
{
    hset *h = n_hset(n, kind);
    if (n->flags & kind_many_flag(kind)) return (holder *)fb_arena_ptr(&t->a, h->many.arr) + i;
    return &h->one;
}

static inline subent *sub_index(const fb_trie *t, uint32_t s)
{
    return (subent *)fb_arena_ptr(&t->a, t->slots[s].index);
}

/* ------------------------------------------------------------------------ */
/* Subscriber slots and the id -> slot hash                                   */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static int64_t slot_lookup(const fb_trie *t, uint64_t id)
{
    if (t->hcap == 0) return -1;
    uint32_t mask = t->hcap - 1, i = (uint32_t)mix64(id) & mask;
    while (t->hvals[i] != HEMPTY) {
        if (t->hkeys[i] == id) return t->hvals[i];
        i = (i + 1) & mask;
    }
    return -1;
}

static void hash_put(uint64_t *keys, uint32_t *vals, uint32_t cap, uint64_t id, uint32_t v)
{
    uint32_t mask = cap - 1, i = (uint32_t)mix64(id) & mask;
    while (vals[i] != HEMPTY) i = (i + 1) & mask;
    keys[i] = id;
    vals[i] = v;
}

static int hash_grow(fb_trie *t)
{
    uint32_t ncap = t->hcap ? t->hcap * 2 : 16;
    if (ncap < t->hcap) return FB_ETOOBIG;
    uint64_t *k = malloc((size_t)ncap * sizeof *k);
    uint32_t *v = malloc((size_t)ncap * sizeof *v);
    if (!k || !v) { free(k); free(v); return FB_ENOMEM; }
    memset(v, 0xff, (size_t)ncap * sizeof *v);
    for (uint32_t i = 0; i < t->hcap; i++)
        if (t->hvals[i] != HEMPTY) hash_put(k, v, ncap, t->hkeys[i], t->hvals[i]);
    free(t->hkeys);
    free(t->hvals);
    t->hkeys = k;
    t->hvals = v;
    t->hcap = ncap;
    return FB_OK;
}

/* Delete by backward shift, so probe chains never need tombstones. */
static void hash_del(fb_trie *t, uint64_t id)
{
    uint32_t mask = t->hcap - 1, i = (uint32_t)mix64(id) & mask;
    while (t->hkeys[i] != id || t->hvals[i] == HEMPTY) {
        if (t->hvals[i] == HEMPTY) return;
        i = (i + 1) & mask;
    }
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (t->hvals[j] == HEMPTY) break;
        uint32_t home = (uint32_t)mix64(t->hkeys[j]) & mask;
        /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        t->hkeys[i] = t->hkeys[j];
        t->hvals[i] = t->hvals[j];
        i = j;
    }
    t->hvals[i] = HEMPTY;
    t->hcount--;
}

static int slot_get_or_create(fb_trie *t, uint64_t id, uint32_t *out)
{
    int64_t s = slot_lookup(t, id);
    if (s >= 0) { *out = (uint32_t)s; return FB_OK; }
    if ((size_t)(t->hcount + 1) * 10 > (size_t)t->hcap * 7) {
        int rc = hash_grow(t);
        if (rc < 0) return rc;
    }
    uint32_t idx;
    if (t->freeslot) {
        idx = t->freeslot - 1;
        t->freeslot = t->slots[idx].index;
    } else {
        if (t->nslots == t->capslots) {
            if (t->capslots >= 0x7fffffffu) return FB_ETOOBIG;
            uint32_t c = t->capslots ? t->capslots * 2 : 16;
            slot *ns = realloc(t->slots, (size_t)c * sizeof *ns);
            if (!ns) return FB_ENOMEM;
            t->slots = ns;
            t->capslots = c;
        }
        idx = t->nslots++;
    }
    slot *sl = &t->slots[idx];
    sl->id = id;
    sl->epoch = 0;
    sl->nkeys = 0;
    sl->cap = 0;
    sl->index = FB_NULLREF;
    hash_put(t->hkeys, t->hvals, t->hcap, id, idx);
    t->hcount++;
    t->liveslots++;
    *out = idx;
    return FB_OK;
}

static void slot_release(fb_trie *t, uint32_t s)
{
    slot *sl = &t->slots[s];
    fb_arena_free(&t->a, sl->index, (size_t)sl->cap * sizeof(subent));
    hash_del(t, sl->id);
    sl->cap = SLOT_FREE;
    sl->nkeys = 0;
    sl->index = t->freeslot;
    t->freeslot = s + 1;
    t->liveslots--;
}

/* Make room for one more index entry. */
static int slot_reserve(fb_trie *t, uint32_t s)
{
    slot *sl = &t->slots[s];
    if (sl->nkeys < sl->cap) return FB_OK;
    if (sl->cap >= 0x40000000u) return FB_ETOOBIG;
    uint32_t c = sl->cap ? sl->cap * 2 : 2;
    fb_ref r = fb_arena_realloc(&t->a, sl->index, (size_t)sl->cap * sizeof(subent),
                                (size_t)c * sizeof(subent));
    if (r == FB_NULLREF) return FB_ENOMEM;
    sl->index = r;
    sl->cap = c;
    return FB_OK;
}

/* Give back index memory once it is three quarters empty (best effort). */
static void slot_shrink(fb_trie *t, uint32_t s)
{
    slot *sl = &t->slots[s];
    if (sl->cap <= 4 || sl->nkeys > sl->cap / 4) return;
    uint32_t c = sl->cap / 2;
    fb_ref r = fb_arena_realloc(&t->a, sl->index, (size_t)sl->cap * sizeof(subent),
                                (size_t)c * sizeof(subent));
    if (r == FB_NULLREF) return;
    sl->index = r;
    sl->cap = c;
}

/* ------------------------------------------------------------------------ */
/* Node moves                                                                 */

/* Patch every reference to the node now at `nr`. */
static void relink(fb_trie *t, fb_ref nr)
{
    node *n = node_at(t, nr);
    if (n->parent == FB_NULLREF) {
        t->root = nr;
    } else {
        node *p = node_at(t, n->parent);
        int ci = child_index(p, n_seg(n)[0]);
        n_children(p)[ci] = nr;
    }
    fb_ref *ch = n_children(n);
    for (uint32_t i = 0; i < n->nchild; i++) node_at(t, ch[i])->parent = nr;
    for (int kind = 0; kind < 2; kind++) {
        uint32_t c = hs_count(n, kind);
        for (uint32_t i = 0; i < c; i++) {
            holder *h = hs_get(t, n, kind, i);
            /* refs == 0: a set that rebuild() just added and the caller has
             * not filled in yet; it has no index entry to patch. */
            if (h->refs) sub_index(t, h->slot)[h->subpos].node = nr;
        }
    }
}

enum { REB_NONE, REB_INSERT, REB_DELETE };

typedef struct reb {
    uint8_t flags;                /* flags of the new node */
    int op;                       /* REB_* on the child table */
    unsigned char label;          /* child to insert or delete */
    fb_ref child;                 /* child to insert */
    const unsigned char *pre;     /* bytes to put before the segment */
    size_t prelen;
    size_t drop;                  /* bytes to drop from the front of the segment */
} reb;

/* Copy node `oref` into a new block with the changes in r, free the old one
 * and relink.  Hold sets that r->flags adds are zeroed; those it removes must
 * be empty.  Returns the new ref or FB_NULLREF (ENOMEM; nothing changed). */
static fb_ref rebuild(fb_trie *t, fb_ref oref, const reb *r)
{
    node *o = node_at(t, oref);
    size_t onc = o->nchild;
    int del = r->op == REB_DELETE ? child_index(o, r->label) : 0;
    if (del < 0) return FB_NULLREF; /* no such child: callers never ask */
    size_t nnc = onc + (r->op == REB_INSERT) - (r->op == REB_DELETE);
    size_t nseg = r->prelen + o->seglen - r->drop;
    size_t osz = node_size(o);
    fb_ref nref = fb_arena_alloc(&t->a, node_bytes(r->flags, nnc, nseg));
    if (nref == FB_NULLREF) return FB_NULLREF;
    o = node_at(t, oref);
    node *n = node_at(t, nref);
    n->parent = o->parent;
    n->seglen = (uint32_t)nseg;
    n->nchild = (uint16_t)nnc;
    n->flags = r->flags;
    n->pad = 0;
    for (int kind = 0; kind < 2; kind++) {
        if (!(r->flags & kind_flag(kind))) continue;
        if (o->flags & kind_flag(kind)) *n_hset(n, kind) = *n_hset(o, kind);
        else memset(n_hset(n, kind), 0, HSET);
    }
    fb_ref *oc = n_children(o), *nc = n_children(n);
    unsigned char *ol = n_labels(o), *nl = n_labels(n);
    if (r->op == REB_INSERT) {
        size_t pos = 0;
        while (pos < onc && ol[pos] < r->label) pos++;
        memcpy(nc, oc, pos * sizeof(fb_ref));
        memcpy(nl, ol, pos);
        nc[pos] = r->child;
        nl[pos] = r->label;
        memcpy(nc + pos + 1, oc + pos, (onc - pos) * sizeof(fb_ref));
        memcpy(nl + pos + 1, ol + pos, onc - pos);
    } else if (r->op == REB_DELETE) {
        size_t pos = (size_t)del;
        memcpy(nc, oc, pos * sizeof(fb_ref));
        memcpy(nl, ol, pos);
        memcpy(nc + pos, oc + pos + 1, (onc - pos - 1) * sizeof(fb_ref));
        memcpy(nl + pos, ol + pos + 1, onc - pos - 1);
    } else {
        memcpy(nc, oc, onc * sizeof(fb_ref));
        memcpy(nl, ol, onc);
    }
    if (r->prelen) memcpy(n_seg(n), r->pre, r->prelen);
    memcpy(n_seg(n) + r->prelen, n_seg(o) + r->drop, o->seglen - r->drop);
    fb_arena_free(&t->a, oref, osz);
    relink(t, nref);
    return nref;
}

/* A fresh node: a leaf, or (with child != NULLREF) a node with one child.
 * `flags` may ask for one holder set, which is zeroed (refs == 0 marks it
 * unfilled) for the caller to fill.  It is not linked into its parent. */
static fb_ref make_node(fb_trie *t, fb_ref parent, const unsigned char *seg, size_t seglen,
                        fb_ref child, unsigned char label, uint8_t flags)
{
    size_t nc = child != FB_NULLREF;
    fb_ref r = fb_arena_alloc(&t->a, node_bytes(flags, nc, seglen));
    if (r == FB_NULLREF) return FB_NULLREF;
    node *n = node_at(t, r);
    n->parent = parent;
    n->seglen = (uint32_t)seglen;
    n->nchild = (uint16_t)nc;
    n->flags = flags;
    n->pad = 0;
    if (flags) memset((unsigned char *)n + HDR, 0, HSET * nsets(flags));
    if (nc) {
        n_children(n)[0] = child;
        n_labels(n)[0] = label;
    }
    if (seglen) memcpy(n_seg(n), seg, seglen);
    t->nnodes++;
    return r;
}

static void free_node(fb_trie *t, fb_ref r)
{
    fb_arena_free(&t->a, r, node_size(node_at(t, r)));
    t->nnodes--;
}

/* Restore canonical form upwards from `nr` after it lost holders or a child:
 * delete holderless leaves, merge holderless single-child nodes into their
 * child.  Out of memory leaves a non-canonical but correct trie. */
static void cleanup(fb_trie *t, fb_ref nr)
{
    while (nr != t->root) {
        node *n = node_at(t, nr);
        if ((n->flags & NF_ANY) || n->nchild >= 2) return;
        fb_ref p = n->parent;
        if (n->nchild == 0) {
            node *pn = node_at(t, p);
            reb r = { pn->flags, REB_DELETE, n_seg(n)[0], FB_NULLREF, NULL, 0, 0 };
            fb_ref np = rebuild(t, p, &r);
            if (np == FB_NULLREF) return;
            free_node(t, nr);
            nr = np;
            continue;
        }
        /* One child: the child absorbs this node's segment. */
        fb_ref c = n_children(n)[0];
        node *cn = node_at(t, c);
        cn->parent = p;
        reb r = { cn->flags, REB_NONE, 0, FB_NULLREF, n_seg(n), n->seglen, 0 };
        if (rebuild(t, c, &r) == FB_NULLREF) {
            node_at(t, c)->parent = nr;
            return;
        }
        free_node(t, nr);
        return;
    }
}

/* ------------------------------------------------------------------------ */
/* Finding and creating nodes                                                 */

/* One step down: the child of n whose whole segment equals k[*i..], with *i
 * advanced past it; FB_NULLREF if there is none.  Requires *i < len. */
static inline fb_ref descend(const fb_trie *t, node *n, const unsigned char *k, size_t len, size_t *i)
{
    int ci = child_index(n, k[*i]);
    if (ci < 0) return FB_NULLREF;
    fb_ref c = n_children(n)[ci];
    node *cn = node_at(t, c);
    if (len - *i < cn->seglen || !seg_equal(cn, k + *i)) return FB_NULLREF;
    *i += cn->seglen;
    return c;
}

static fb_ref find_node(const fb_trie *t, const unsigned char *key, size_t len)
{
    fb_ref cur = t->root;
    size_t i = 0;
    while (i < len && cur != FB_NULLREF) cur = descend(t, node_at(t, cur), key, len, &i);
    return cur;
}

/* Find or create the node of `key`.  A leaf created here already has an
 * unfilled holder set of `kind` (*fresh = 1), so the caller fills it in place
 * instead of rebuilding the node.  On ENOMEM the trie is left correct and
 * *out is the deepest node reached, which may be a fresh split that the
 * caller passes to cleanup(). */
static int insert_node(fb_trie *t, const unsigned char *key, size_t len, int kind,
                       fb_ref *out, int *fresh)
{
    *fresh = 0;
    fb_ref cur = t->root;
    size_t i = 0;
    for (;;) {
        if (i == len) { *out = cur; return FB_OK; }
        node *n = node_at(t, cur);
        int ci = child_index(n, key[i]);
        if (ci < 0) {
            fb_ref leaf = make_node(t, cur, key + i, len - i, FB_NULLREF, 0, kind_flag(kind));
            if (leaf == FB_NULLREF) { *out = cur; return FB_ENOMEM; }
            n = node_at(t, cur);
            reb r = { n->flags, REB_INSERT, key[i], leaf, NULL, 0, 0 };
            if (rebuild(t, cur, &r) == FB_NULLREF) {
                free_node(t, leaf);
                *out = cur;
                return FB_ENOMEM;
            }
            *out = leaf;
            *fresh = 1;
            return FB_OK;
        }
        fb_ref c = n_children(n)[ci];
        node *cn = node_at(t, c);
        const unsigned char *seg = n_seg(cn);
        size_t lim = len - i < cn->seglen ? len - i : cn->seglen;
        size_t m = 1;
        while (m < lim && seg[m] == key[i + m]) m++;
        if (m == cn->seglen) { cur = c; i += m; continue; }
        /* Split c after m bytes: mid takes seg[0..m), c keeps seg[m..). */
        fb_ref mid = make_node(t, cur, seg, m, c, seg[m], 0);
        if (mid == FB_NULLREF) { *out = cur; return FB_ENOMEM; }
        n = node_at(t, cur);
        cn = node_at(t, c);
        n_children(n)[ci] = mid;
        cn->parent = mid;
        reb r = { cn->flags, REB_NONE, 0, FB_NULLREF, NULL, 0, m };
        if (rebuild(t, c, &r) == FB_NULLREF) {
            node_at(t, c)->parent = cur;
            n_children(node_at(t, cur))[ci] = c;
            free_node(t, mid);
            *out = cur;
            return FB_ENOMEM;
        }
        cur = mid;
        i += m;
    }
}

/* ------------------------------------------------------------------------ */
/* Holders                                                                    */

/* Position of slot's holder in (node, kind), or -1. */
static int64_t holder_find(const fb_trie *t, fb_ref nr, int kind, uint32_t s)
{
    node *n = node_at(t, nr);
    uint32_t c = hs_count(n, kind);
    if (c == 0) return -1;
    if (!(n->flags & kind_many_flag(kind))) return n_hset(n, kind)->one.slot == s ? 0 : -1;
    /* Scan whichever side is shorter: the key's holders or the subscriber's keys. */
    const slot *sl = &t->slots[s];
    if (sl->nkeys < c) {
        const subent *e = sub_index(t, s);
        for (uint32_t i = 0; i < sl->nkeys; i++)
            if (e[i].node == nr && (int)(e[i].pos_kind & 1u) == kind) return e[i].pos_kind >> 1;
        return -1;
    }
    const holder *h = hs_get(t, n, kind, 0);
    for (uint32_t i = 0; i < c; i++)
        if (h[i].slot == s) return i;
    return -1;
}

/* Link holder h (at position pos of (nr, kind)) and the subscriber's next
 * index entry to each other.  The index has room (slot_reserve). */
static void holder_link(fb_trie *t, fb_ref nr, int kind, uint32_t s, holder *h, uint32_t pos)
{
    slot *sl = &t->slots[s];
    uint32_t sp = sl->nkeys++;
    subent *e = sub_index(t, s) + sp;
    e->node = nr;
    e->pos_kind = (pos << 1) | (uint32_t)kind;
    h->slot = s;
    h->refs = 1;
    h->subpos = sp;
    t->nsubs++;
}

/* Add slot as a new holder of (node, kind) with one reference; the index has
 * room (slot_reserve).  *nrp is updated if the node moves.  Returns 1 if it
 * is the first holder. */
static int holder_add(fb_trie *t, fb_ref *nrp, int kind, uint32_t s)
{
    fb_ref nr = *nrp;
    node *n = node_at(t, nr);
    uint32_t c = hs_count(n, kind);
    holder *h;
    uint32_t pos;
    if (c == 0) {
        reb r = { (uint8_t)(n->flags | kind_flag(kind)), REB_NONE, 0, FB_NULLREF, NULL, 0, 0 };
        nr = rebuild(t, nr, &r);
        if (nr == FB_NULLREF) return FB_ENOMEM;
        *nrp = nr;
        n = node_at(t, nr);
        h = &n_hset(n, kind)->one;
        pos = 0;
    } else if (c == 1) {
        fb_ref arr = fb_arena_alloc(&t->a, 4 * sizeof(holder));
        if (arr == FB_NULLREF) return FB_ENOMEM;
        n = node_at(t, nr);
        hset *hs = n_hset(n, kind);
        holder *ha = (holder *)fb_arena_ptr(&t->a, arr);
        ha[0] = hs->one;
        hs->many.arr = arr;
        hs->many.n = 2;
        hs->many.cap = 4;
        n->flags |= kind_many_flag(kind);
        h = &ha[1];
        pos = 1;
    } else {
        hset *hs = n_hset(n, kind);
        if (hs->many.n == hs->many.cap) {
            if (hs->many.cap >= 0x40000000u) return FB_ETOOBIG;
            uint32_t nc = hs->many.cap * 2;
            fb_ref arr = fb_arena_realloc(&t->a, hs->many.arr, (size_t)hs->many.cap * sizeof(holder),
                                          (size_t)nc * sizeof(holder));
            if (arr == FB_NULLREF) return FB_ENOMEM;
            n = node_at(t, nr);
            hs = n_hset(n, kind);
            hs->many.arr = arr;
            hs->many.cap = nc;
        }
        pos = hs->many.n++;
        h = (holder *)fb_arena_ptr(&t->a, hs->many.arr) + pos;
    }
    holder_link(t, nr, kind, s, h, pos);
    if (c == 0) t->nkeys++;
    return c == 0;
}

/* Swap-remove entry `subpos` of subscriber s's index, repointing the holder
 * of the entry that moves into its place. */
static void index_unlink(fb_trie *t, uint32_t s, uint32_t subpos)
{
    slot *sl = &t->slots[s];
    subent *idx = sub_index(t, s);
    uint32_t last = --sl->nkeys;
    if (subpos != last) {
        idx[subpos] = idx[last];
        node *m = node_at(t, idx[last].node);
        hs_get(t, m, (int)(idx[last].pos_kind & 1u), idx[last].pos_kind >> 1)->subpos = subpos;
    }
    t->nsubs--;
}

/* Remove the holder at `pos` of (node, kind) whatever its count.  Returns the
 * node's ref (it moves when its last holder of this kind goes) and sets
 * *emptied when the set became empty.  May fail only when an inline->removal
 * rebuild cannot allocate: then FB_NULLREF and nothing changed. */
static fb_ref holder_del(fb_trie *t, fb_ref nr, int kind, uint32_t pos, int *emptied)
{
    node *n = node_at(t, nr);
    uint32_t c = hs_count(n, kind);
    *emptied = 0;
    if (c == 1) {
        /* Dropping the set changes the node's size: do the fallible part first. */
        reb r = { (uint8_t)(n->flags & ~kind_flag(kind)), REB_NONE, 0, FB_NULLREF, NULL, 0, 0 };
        holder gone = n_hset(n, kind)->one;
        fb_ref nn = rebuild(t, nr, &r);
        if (nn == FB_NULLREF) return FB_NULLREF;
        nr = nn;
        *emptied = 1;
        t->nkeys--;
        index_unlink(t, gone.slot, gone.subpos);
        return nr;
    }
    hset *hs = n_hset(n, kind);
    holder *ha = (holder *)fb_arena_ptr(&t->a, hs->many.arr);
    holder gone = ha[pos];
    uint32_t lastpos = --hs->many.n;
    if (pos != lastpos) {
        ha[pos] = ha[lastpos];
        sub_index(t, ha[pos].slot)[ha[pos].subpos].pos_kind = (pos << 1) | (uint32_t)kind;
    }
    if (hs->many.n == 1) {
        /* Back to one inline holder. */
        holder only = ha[0];
        fb_arena_free(&t->a, hs->many.arr, (size_t)hs->many.cap * sizeof(holder));
        hs->one = only;
        n->flags &= (uint8_t)~kind_many_flag(kind);
        sub_index(t, only.slot)[only.subpos].pos_kind = (uint32_t)kind;
    } else if (hs->many.cap > 4 && hs->many.n <= hs->many.cap / 4) {
        uint32_t ncap = hs->many.cap / 2;
        fb_ref arr = fb_arena_realloc(&t->a, hs->many.arr, (size_t)hs->many.cap * sizeof(holder),
                                      (size_t)ncap * sizeof(holder));
        if (arr != FB_NULLREF) {
            n = node_at(t, nr);
            hs = n_hset(n, kind);
            hs->many.arr = arr;
            hs->many.cap = ncap;
        }
    }
    index_unlink(t, gone.slot, gone.subpos);
    return nr;
}

/* ------------------------------------------------------------------------ */
/* Public API                                                                 */

fb_trie *fb_trie_new(void)
{
    fb_trie *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    fb_arena_init(&t->a);
    t->root = make_node(t, FB_NULLREF, NULL, 0, FB_NULLREF, 0, 0);
    if (t->root == FB_NULLREF) {
        fb_arena_destroy(&t->a);
        free(t);
        return NULL;
    }
    return t;
}

void fb_trie_free(fb_trie *t)
{
    if (!t) return;
    fb_arena_destroy(&t->a);
    free(t->slots);
    free(t->hkeys);
    free(t->hvals);
    free(t->kbuf);
    free(t->hits);
    free(t);
}

static int check_args(const void *key, size_t len, int kind)
{
    if (kind != FB_EXACT && kind != FB_PREFIX) return FB_EINVAL;
    if (len > FB_MAX_KEY) return FB_ETOOBIG;
    if (len && !key) return FB_EINVAL;
    return FB_OK;
}

int fb_trie_add(fb_trie *t, const void *key, size_t len, int kind, uint64_t subscriber)
{
    int rc = check_args(key, len, kind);
    if (rc < 0) return rc;
    const unsigned char *k = key;
    uint32_t sl;
    int created_slot = slot_lookup(t, subscriber) < 0;
    rc = slot_get_or_create(t, subscriber, &sl);
    if (rc < 0) return rc;
    /* Room for one more index entry first: after that nothing can fail
     * between creating a node and linking its holder. */
    rc = slot_reserve(t, sl);
    fb_ref nr = t->root;
    int fresh = 0;
    if (rc >= 0) rc = insert_node(t, k, len, kind, &nr, &fresh);
    if (rc >= 0) {
        if (fresh) {
            holder_link(t, nr, kind, sl, &n_hset(node_at(t, nr), kind)->one, 0);
            t->nkeys++;
            return 1;
        }
        int64_t pos = created_slot ? -1 : holder_find(t, nr, kind, sl);
        if (pos >= 0) {
            holder *h = hs_get(t, node_at(t, nr), kind, (uint32_t)pos);
            if (h->refs == UINT32_MAX) return FB_EOVERFLOW;
            h->refs++;
            return 0;
        }
        rc = holder_add(t, &nr, kind, sl);
    }
    if (rc < 0) {
        cleanup(t, nr);
        if (created_slot) slot_release(t, sl);
    }
    return rc;
}

int fb_trie_remove(fb_trie *t, const void *key, size_t len, int kind, uint64_t subscriber)
{
    int rc = check_args(key, len, kind);
    if (rc < 0) return rc;
    int64_t s = slot_lookup(t, subscriber);
    if (s < 0) return FB_ENOTFOUND;
    fb_ref nr = find_node(t, key, len);
    if (nr == FB_NULLREF) return FB_ENOTFOUND;
    int64_t pos = holder_find(t, nr, kind, (uint32_t)s);
    if (pos < 0) return FB_ENOTFOUND;
    holder *h = hs_get(t, node_at(t, nr), kind, (uint32_t)pos);
    if (h->refs > 1) { h->refs--; return 0; }
    int emptied;
    fb_ref nn = holder_del(t, nr, kind, (uint32_t)pos, &emptied);
    if (nn == FB_NULLREF) return FB_ENOMEM;
    if (t->slots[s].nkeys == 0) slot_release(t, (uint32_t)s);
    else slot_shrink(t, (uint32_t)s);
    if (emptied) cleanup(t, nn);
    fb_arena_maybe_trim(&t->a);
    return emptied;
}

static int kbuf_reserve(unsigned char **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return FB_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2) return FB_ENOMEM;
        c *= 2;
    }
    unsigned char *p = realloc(*buf, c);
    if (!p) return FB_ENOMEM;
    *buf = p;
    *cap = c;
    return FB_OK;
}

/* The full key of node nr, into *buf (grown as needed). */
static int node_key(const fb_trie *t, fb_ref nr, unsigned char **buf, size_t *cap, size_t *len)
{
    size_t total = 0;
    for (fb_ref r = nr; r != FB_NULLREF; r = node_at(t, r)->parent) total += node_at(t, r)->seglen;
    int rc = kbuf_reserve(buf, cap, total ? total : 1);
    if (rc < 0) return rc;
    size_t end = total;
    for (fb_ref r = nr; r != FB_NULLREF; r = node_at(t, r)->parent) {
        node *n = node_at(t, r);
        end -= n->seglen;
        memcpy(*buf + end, n_seg(n), n->seglen);
    }
    *len = total;
    return FB_OK;
}

int fb_trie_remove_subscriber(fb_trie *t, uint64_t subscriber, fb_keylist *gone)
{
    int64_t s = slot_lookup(t, subscriber);
    if (s < 0) return 0;
    uint32_t held = t->slots[s].nkeys;
    int err = FB_OK;
    while (t->slots[s].nkeys > 0) {
        subent e = sub_index(t, (uint32_t)s)[t->slots[s].nkeys - 1];
        int kind = (int)(e.pos_kind & 1u);
        node *n = node_at(t, e.node);
        if (gone && hs_count(n, kind) == 1 && err == FB_OK) {
            size_t klen;
            int rc = node_key(t, e.node, &t->kbuf, &t->kcap, &klen);
            if (rc == FB_OK) rc = fb_keylist_push(gone, kind ? FB_KL_PREFIX : 0, 0, t->kbuf, klen);
            if (rc < 0) err = rc;
        }
        int emptied;
        fb_ref nn = holder_del(t, e.node, kind, e.pos_kind >> 1, &emptied);
        if (nn == FB_NULLREF) return FB_ENOMEM; /* state is consistent; caller may retry */
        if (emptied) cleanup(t, nn);
    }
    slot_release(t, (uint32_t)s);
    /* A subscriber that held many keys leaves whole segments empty: give
     * them back (see fb_arena.h), so that RSS follows the table down. */
    fb_arena_maybe_trim(&t->a);
    return err < 0 ? err : (int)(held > 0x7fffffffu ? 0x7fffffff : held);
}

static inline uint32_t next_epoch(fb_trie *t)
{
    if (++t->epoch == 0) {
        for (uint32_t i = 0; i < t->nslots; i++) t->slots[i].epoch = 0;
        t->epoch = 1;
    }
    return t->epoch;
}

static inline int collect(fb_trie *t, node *n, int kind, uint32_t ep, fb_idvec *out)
{
    uint32_t c = hs_count(n, kind);
    if (out->n + c > out->cap && fb_idvec_reserve(out, c) < 0) return FB_ENOMEM;
    holder *h = hs_get(t, n, kind, 0);
    for (uint32_t i = 0; i < c; i++) {
        slot *sl = &t->slots[h[i].slot];
        if (sl->epoch != ep) {
            sl->epoch = ep;
            out->ids[out->n++] = sl->id;
        }
    }
    return FB_OK;
}

static inline int match_one(fb_trie *t, const unsigned char *k, size_t len, fb_idvec *out)
{
    uint32_t ep = next_epoch(t);
    fb_ref cur = t->root;
    size_t i = 0;
    for (;;) {
        node *n = node_at(t, cur);
        if ((n->flags & NF_PREFIX) && collect(t, n, FB_PREFIX, ep, out) < 0) return FB_ENOMEM;
        if (i == len) {
            if ((n->flags & NF_EXACT) && collect(t, n, FB_EXACT, ep, out) < 0) return FB_ENOMEM;
            return FB_OK;
        }
        cur = descend(t, n, k, len, &i);
        if (cur == FB_NULLREF) return FB_OK;
    }
}

int fb_trie_match(fb_trie *t, const void *topic, size_t len, fb_idvec *out)
{
    if (len && !topic) return FB_EINVAL;
    size_t before = out->n;
    int rc = match_one(t, topic, len, out);
    if (rc < 0) { out->n = before; return rc; }
    size_t got = out->n - before;
    return got > 0x7fffffff ? 0x7fffffff : (int)got;
}

/*
 * Batch matching hides memory latency.  A lookup in a large trie is a chain of
 * dependent cache misses (one per level below the cached top), so matching
 * topics one after another leaves the CPU waiting on each miss in turn.  Here
 * LANES topics are walked together: each round advances every lane by one
 * node and prefetches that lane's next node, so the misses of different
 * topics overlap.  Pass 1 records, per topic, the nodes whose holders match
 * (at most HITS_PER_TOPIC; a topic with more falls back to match_one);
 * pass 2 collects the subscribers topic by topic, from nodes pass 1 has just
 * brought into cache, so the output stays grouped by topic.
 */
#ifndef LANES
#define LANES 16
#endif
#define HITS_PER_TOPIC 6
#define SMALL_TRIE_NODES 2048   /* ~100 KB of nodes: walked one topic at a time */

typedef struct hit { fb_ref node; uint32_t kinds; } hit; /* kinds: bit FB_EXACT, bit FB_PREFIX */

typedef struct lane {
    const unsigned char *k;
    size_t len, i, topic;
    fb_ref cur;
    uint32_t nhits;
    int active;
} lane;

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif

/* A macro, not a function: GCC's pure/const analysis treats a void helper
 * whose only statements are prefetches as free of side effects and deletes
 * the call.  Two lines: most nodes are under 64 bytes, few start on a line. */
#define PREFETCH_NODE(t, r) do { \
        const char *p_ = (const char *)fb_arena_ptr(&(t)->a, (r)); \
        PREFETCH(p_); \
        PREFETCH(p_ + 56); \
    } while (0)

/* Advance one lane by one node.  Returns 0 when its topic is done. */
static inline int lane_step(const fb_trie *t, lane *l, hit *hits, uint8_t *nh)
{
    node *n = node_at(t, l->cur);
    if (l->cur != t->root) {
        /* Verify the segment of the node we descended into. */
        if (l->len - l->i < n->seglen || !seg_equal(n, l->k + l->i)) return 0;
        l->i += n->seglen;
    }
    uint32_t kinds = 0;
    if (n->flags & NF_PREFIX) kinds |= 1u << FB_PREFIX;
    if (l->i == l->len && (n->flags & NF_EXACT)) kinds |= 1u << FB_EXACT;
    if (kinds) {
        if (l->nhits == HITS_PER_TOPIC) {
            nh[l->topic] = UINT8_MAX; /* overflow: pass 2 redoes this topic */
            return 0;
        }
        hits[l->topic * HITS_PER_TOPIC + l->nhits++] = (hit){ l->cur, kinds };
        nh[l->topic] = (uint8_t)l->nhits;
    }
    if (l->i == l->len) return 0;
    int ci = child_index(n, l->k[l->i]);
    if (ci < 0) return 0;
    l->cur = n_children(n)[ci];
    PREFETCH_NODE(t, l->cur);
    return 1;
}

int fb_trie_match_batch(fb_trie *t, const fb_span *topics, size_t n, size_t *offsets, fb_idvec *out)
{
    size_t before = out->n;
    if (n == 0) {
        offsets[0] = out->n;
        return FB_OK;
    }
    for (size_t i = 0; i < n; i++)
        if (topics[i].len && !topics[i].ptr) return FB_EINVAL;
    if (t->nnodes <= SMALL_TRIE_NODES) {
        /* A small trie stays in cache: the lanes would only add overhead. */
        for (size_t i = 0; i < n; i++) {
            offsets[i] = out->n;
            if (match_one(t, topics[i].ptr, topics[i].len, out) < 0) {
                out->n = before;
                return FB_ENOMEM;
            }
        }
        offsets[n] = out->n;
        return FB_OK;
    }
    if (n > SIZE_MAX / (HITS_PER_TOPIC * sizeof(hit) + 1)) return FB_ENOMEM;
    size_t need = n * (HITS_PER_TOPIC * sizeof(hit) + 1);
    if (need > t->hcap_hits) {
        void *p = realloc(t->hits, need);
        if (!p) return FB_ENOMEM;
        t->hits = p;
        t->hcap_hits = need;
    }
    hit *hits = t->hits;
    uint8_t *nh = (uint8_t *)(hits + n * HITS_PER_TOPIC);
    memset(nh, 0, n);

    /* Pass 1: find the matching nodes, LANES topics at a time. */
    lane lanes[LANES];
    size_t next = 0, active = 0;
    for (int j = 0; j < LANES; j++) lanes[j].active = 0;
    do {
        active = 0;
        for (int j = 0; j < LANES; j++) {
            lane *l = &lanes[j];
            if (!l->active) {
                if (next == n) continue;
                *l = (lane){ topics[next].ptr, topics[next].len, 0, next, t->root, 0, 1 };
                /* The topic a lane will take after the current ones. */
                if (next + LANES < n) PREFETCH(topics[next + LANES].ptr);
                next++;
            }
            l->active = lane_step(t, l, hits, nh);
            active += (size_t)l->active;
        }
    } while (active || next < n);

    /* Pass 2: collect subscribers per topic, each once. */
    for (size_t i = 0; i < n; i++) {
        offsets[i] = out->n;
        int rc = FB_OK;
        if (nh[i] == UINT8_MAX) {
            rc = match_one(t, topics[i].ptr, topics[i].len, out);
        } else if (nh[i]) {
            uint32_t ep = next_epoch(t);
            const hit *h = hits + i * HITS_PER_TOPIC;
            for (uint32_t j = 0; j < nh[i] && rc == FB_OK; j++) {
                node *nd = node_at(t, h[j].node);
                if (h[j].kinds & (1u << FB_PREFIX)) rc = collect(t, nd, FB_PREFIX, ep, out);
                if (rc == FB_OK && (h[j].kinds & (1u << FB_EXACT))) rc = collect(t, nd, FB_EXACT, ep, out);
            }
        }
        if (rc < 0) { out->n = before; return rc; }
    }
    offsets[n] = out->n;
    return FB_OK;
}

int fb_trie_any_match(const fb_trie *t, const void *topic, size_t len)
{
    const unsigned char *k = topic;
    fb_ref cur = t->root;
    size_t i = 0;
    for (;;) {
        node *n = node_at(t, cur);
        if (n->flags & NF_PREFIX) return 1;
        if (i == len) return (n->flags & NF_EXACT) ? 1 : 0;
        cur = descend(t, n, k, len, &i);
        if (cur == FB_NULLREF) return 0;
    }
}

int fb_trie_covered(const fb_trie *t, const void *key, size_t len, int kind)
{
    const unsigned char *k = key;
    fb_ref cur = t->root;
    size_t i = 0;
    for (;;) {
        node *n = node_at(t, cur);
        if (i == len) return (kind == FB_EXACT && (n->flags & NF_PREFIX)) ? 1 : 0;
        if (n->flags & NF_PREFIX) return 1;
        cur = descend(t, n, k, len, &i);
        if (cur == FB_NULLREF) return 0;
    }
}

uint32_t fb_trie_refcount(const fb_trie *t, const void *key, size_t len, int kind, uint64_t subscriber)
{
    if (check_args(key, len, kind) < 0) return 0;
    int64_t s = slot_lookup(t, subscriber);
    if (s < 0) return 0;
    fb_ref nr = find_node(t, key, len);
    if (nr == FB_NULLREF) return 0;
    int64_t pos = holder_find(t, nr, kind, (uint32_t)s);
    return pos < 0 ? 0 : hs_get(t, node_at(t, nr), kind, (uint32_t)pos)->refs;
}

size_t fb_trie_holders(const fb_trie *t, const void *key, size_t len, int kind)
{
    if (check_args(key, len, kind) < 0) return 0;
    fb_ref nr = find_node(t, key, len);
    return nr == FB_NULLREF ? 0 : hs_count(node_at(t, nr), kind);
}

typedef struct frame { fb_ref node; uint32_t next; size_t keylen; } frame;

int fb_trie_walk(const fb_trie *t, const void *prefix, size_t plen, fb_walk_fn fn, void *ctx)
{
    const unsigned char *p = prefix;
    if (plen && !p) return FB_EINVAL;
    /* Find the highest node whose key starts with prefix. */
    fb_ref cur = t->root;
    size_t i = 0;
    while (i < plen) {
        node *n = node_at(t, cur);
        int ci = child_index(n, p[i]);
        if (ci < 0) return FB_OK;
        fb_ref c = n_children(n)[ci];
        node *cn = node_at(t, c);
        size_t m = plen - i < cn->seglen ? plen - i : cn->seglen;
        if (memcmp(n_seg(cn), p + i, m) != 0) return FB_OK;
        i += cn->seglen;
        cur = c;
    }
    unsigned char *kb = NULL;
    size_t kcap = 0, klen;
    frame *st = NULL;
    size_t sp = 0, scap = 0;
    int rc = node_key(t, cur, &kb, &kcap, &klen);
    if (rc < 0) goto out;
    node *n = node_at(t, cur);
    int r = FB_WALK_NEXT;
    if (n->flags & NF_ANY) r = fn(ctx, kb, klen, hs_count(n, FB_EXACT), hs_count(n, FB_PREFIX));
    if (r < 0) { rc = r; goto out; }
    if (r == FB_WALK_STOP || r == FB_WALK_SKIP || n->nchild == 0) goto out;
    scap = 16;
    st = malloc(scap * sizeof *st);
    if (!st) { rc = FB_ENOMEM; goto out; }
    st[sp++] = (frame){ cur, 0, klen };
    while (sp > 0) {
        frame *f = &st[sp - 1];
        node *fn_ = node_at(t, f->node);
        if (f->next == fn_->nchild) { sp--; continue; }
        fb_ref c = n_children(fn_)[f->next++];
        size_t base = f->keylen;
        node *cn = node_at(t, c);
        size_t kl = base + cn->seglen;
        rc = kbuf_reserve(&kb, &kcap, kl);
        if (rc < 0) goto out;
        memcpy(kb + base, n_seg(cn), cn->seglen);
        r = FB_WALK_NEXT;
        if (cn->flags & NF_ANY) r = fn(ctx, kb, kl, hs_count(cn, FB_EXACT), hs_count(cn, FB_PREFIX));
        if (r < 0) { rc = r; goto out; }
        if (r == FB_WALK_STOP) goto out;
        if (r == FB_WALK_SKIP || cn->nchild == 0) continue;
        if (sp == scap) {
            frame *ns = realloc(st, scap * 2 * sizeof *st);
            if (!ns) { rc = FB_ENOMEM; goto out; }
            st = ns;
            scap *= 2;
        }
        st[sp++] = (frame){ c, 0, kl };
    }
out:
    free(st);
    free(kb);
    return rc;
}

int fb_trie_subscriber_keys(const fb_trie *t, uint64_t subscriber, fb_keylist *out)
{
    return fb_trie_subscriber_keys_some(t, subscriber, out, 0);
}

int fb_trie_subscriber_keys_some(const fb_trie *t, uint64_t subscriber, fb_keylist *out, size_t max_bytes)
{
    int64_t s = slot_lookup(t, subscriber);
    if (s < 0) return FB_OK;
    unsigned char *kb = NULL;
    size_t kcap = 0, klen, start = out->nbytes;
    int rc = FB_OK;
    const slot *sl = &t->slots[s];
    for (uint32_t i = 0; i < sl->nkeys && rc == FB_OK && !(max_bytes && out->nbytes - start >= max_bytes); i++) {
        subent e = sub_index(t, (uint32_t)s)[i];
        int kind = (int)(e.pos_kind & 1u);
        rc = node_key(t, e.node, &kb, &kcap, &klen);
        if (rc == FB_OK) {
            uint32_t refs = hs_get(t, node_at(t, e.node), kind, e.pos_kind >> 1)->refs;
            rc = fb_keylist_push(out, kind ? FB_KL_PREFIX : 0, refs, kb, klen);
        }
    }
    free(kb);
    return rc;
}

void fb_trie_get_stats(const fb_trie *t, fb_trie_stats *s)
{
    size_t tables = (size_t)t->capslots * sizeof(slot) +
                    (size_t)t->hcap * (sizeof(uint64_t) + sizeof(uint32_t)) + t->kcap;
    s->keys = t->nkeys;
    s->subscriptions = t->nsubs;
    s->subscribers = t->liveslots;
    s->nodes = t->nnodes;
    s->bytes_live = t->a.live + tables + sizeof *t;
    s->bytes_reserved = t->a.reserved + tables + sizeof *t +
                        (size_t)t->a.capsegs * sizeof(void *) + (size_t)t->a.capbigs * sizeof(void *);
}

/* ------------------------------------------------------------------------ */
/* Invariant checker                                                          */

int fb_trie_check(const fb_trie *t, const char **why)
{
    const char *msg = NULL;
    uint32_t *mark = calloc(t->nslots ? t->nslots : 1, sizeof *mark);
    fb_ref *st = NULL;
    size_t sp = 0, scap = 64;
    size_t nodes = 0, keys = 0, subs = 0;
    uint32_t stamp = 0;
    /* The arena is audited against the blocks the trie owns: nodes, holder
     * arrays, subscriber indexes.  That finds a block freed with the wrong
     * size (a leak, or a trimmed segment still in use). */
    fb_arena_audit au;
    const char *aerr = fb_arena_audit_begin(&au, &t->a);
    if (aerr) { free(mark); return FB_ENOMEM; }
    st = malloc(scap * sizeof *st);
    if (!mark || !st) { free(mark); free(st); fb_arena_audit_end(&au); return FB_ENOMEM; }
#define FAIL(m) do { msg = (m); goto out; } while (0)
#define AUDIT(r, bytes) do { if ((aerr = fb_arena_audit_block(&au, (r), (bytes))) != NULL) FAIL(aerr); } while (0)
    node *root = node_at(t, t->root);
    if (root->parent != FB_NULLREF || root->seglen != 0) FAIL("bad root");
    st[sp++] = t->root;
    while (sp > 0) {
        fb_ref nr = st[--sp];
        node *n = node_at(t, nr);
        nodes++;
        if (n->flags & ~0xFu) FAIL("unknown node flags");
        AUDIT(nr, node_size(n));
        if ((n->flags & NF_EXACT_MANY) && !(n->flags & NF_EXACT)) FAIL("exact many without exact");
        if ((n->flags & NF_PREFIX_MANY) && !(n->flags & NF_PREFIX)) FAIL("prefix many without prefix");
        if (nr != t->root && !(n->flags & NF_ANY) && n->nchild < 2) FAIL("non-canonical node");
        fb_ref *ch = n_children(n);
        unsigned char *lb = n_labels(n);
        for (uint32_t i = 0; i < n->nchild; i++) {
            node *c = node_at(t, ch[i]);
            if (i > 0 && lb[i - 1] >= lb[i]) FAIL("labels not sorted");
            if (c->seglen < 1) FAIL("empty child segment");
            if (n_seg(c)[0] != lb[i]) FAIL("label differs from segment");
            if (c->parent != nr) FAIL("bad parent ref");
            if (sp == scap) {
                fb_ref *ns = realloc(st, scap * 2 * sizeof *st);
                if (!ns) { fb_arena_audit_end(&au); free(mark); free(st); return FB_ENOMEM; }
                st = ns;
                scap *= 2;
            }
            st[sp++] = ch[i];
        }
        for (int kind = 0; kind < 2; kind++) {
            uint32_t c = hs_count(n, kind);
            if (!c) continue;
            keys++;
            if (n->flags & kind_many_flag(kind)) {
                hset *hs = n_hset(n, kind);
                if (hs->many.n < 2 || hs->many.n > hs->many.cap) FAIL("bad holder array size");
                AUDIT(hs->many.arr, (size_t)hs->many.cap * sizeof(holder));
            }
            if (++stamp == 0) FAIL("stamp wrapped");
            for (uint32_t i = 0; i < c; i++) {
                holder *h = hs_get(t, n, kind, i);
                if (h->slot >= t->nslots) FAIL("holder slot out of range");
                const slot *sl = &t->slots[h->slot];
                if (sl->cap == SLOT_FREE) FAIL("holder on a free slot");
                if (h->refs < 1) FAIL("zero refcount");
                if (h->subpos >= sl->nkeys) FAIL("subpos out of range");
                const subent *e = sub_index(t, h->slot) + h->subpos;
                if (e->node != nr || e->pos_kind != ((i << 1) | (uint32_t)kind)) FAIL("index entry does not point back");
                if (mark[h->slot] == stamp) FAIL("subscriber holds a key twice");
                mark[h->slot] = stamp;
                subs++;
            }
        }
    }
    if (nodes != t->nnodes) FAIL("node count");
    if (keys != t->nkeys) FAIL("key count");
    if (subs != t->nsubs) FAIL("subscription count");
    size_t entries = 0, live = 0;
    for (uint32_t s = 0; s < t->nslots; s++) {
        const slot *sl = &t->slots[s];
        if (sl->cap == SLOT_FREE) continue;
        live++;
        if (sl->nkeys == 0) FAIL("live subscriber without keys");
        if (sl->nkeys > sl->cap) FAIL("index overfull");
        AUDIT(sl->index, (size_t)sl->cap * sizeof(subent));
        if (slot_lookup(t, sl->id) != (int64_t)s) FAIL("hash does not find subscriber");
        entries += sl->nkeys;
    }
    if (live != t->liveslots || live != t->hcount) FAIL("subscriber count");
    if (entries != t->nsubs) FAIL("index entry count");
#undef AUDIT
#undef FAIL
out:
    aerr = fb_arena_audit_end(&au);
    if (!msg && aerr == FB_ARENA_AUDIT_NOMEM) { free(mark); free(st); return FB_ENOMEM; }
    if (!msg) msg = aerr;
    free(mark);
    free(st);
    if (why) *why = msg ? msg : "ok";
    return msg ? FB_EINVAL : FB_OK;
}
