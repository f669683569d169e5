/* fb_arena.c - segmented arena with 32-bit refs (see fb_arena.h). */
#define _DEFAULT_SOURCE 1 /* madvise, MAP_ANONYMOUS */
#include "fb_arena.h"

#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define SEG_BYTES ((size_t)FB_SEG_UNITS * FB_UNIT)
#define SEG_FIRST_UNITS 4096u /* 32 KiB: a small table stays small */
#define TRIM_MIN_BYTES ((size_t)64 * 1024)

/* Segment i holds min(32 KiB << i, 2 MiB): a trie with a handful of keys
 * costs tens of KiB, not a huge page, while a big one soon reaches full-size,
 * huge-page-backed segments.  Addresses never move, so refs stay
 * (segment, offset) with a fixed 18-bit offset.  The size depends only on
 * the index, so a trimmed index gets a segment of the same size again. */
static uint32_t seg_units(uint32_t i)
{
    return i >= 6 ? FB_SEG_UNITS : SEG_FIRST_UNITS << i;
}

static size_t seg_bytes(uint32_t i) { return (size_t)seg_units(i) * FB_UNIT; }

/* Units of segment i that can be handed out: its last FB_ARENA_SLACK bytes
 * never are. */
static uint32_t seg_cap(uint32_t i) { return seg_units(i) - FB_ARENA_SLACK / FB_UNIT; }

/* Unit 0 of segment 0 is never handed out, so ref 0 can mean NULL. */
static uint32_t seg_first(uint32_t i) { return i == 0 ? 1u : 0u; }

static size_t units_of(size_t bytes)
{
    size_t u = (bytes + FB_UNIT - 1) / FB_UNIT;
    return u ? u : 1;
}

void fb_arena_init(fb_arena *a) { memset(a, 0, sizeof *a); }

/* Segments are aligned to, and as large as, a 2 MiB huge page.  A big trie
 * is walked at random: with 4 KiB pages nearly every node visit would also
 * miss the TLB.  Where the kernel offers transparent huge pages on request,
 * ask for them.  On Linux a full-size segment is its own mapping, so that
 * trimming it (munmap) returns its pages whatever malloc would have done
 * with a freed 2 MiB chunk (glibc keeps one that it took from its heap,
 * which it does once its mmap threshold has grown).  Elsewhere this is an
 * ordinary aligned allocation. */
static unsigned char *seg_alloc(size_t bytes)
{
#if defined(_WIN32)
    return malloc(bytes);
#elif defined(__linux__)
    if (bytes < SEG_BYTES) return malloc(bytes);
    /* Map twice the size and cut an aligned segment out of it. */
    unsigned char *p = mmap(NULL, 2 * SEG_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uintptr_t start = ((uintptr_t)p + SEG_BYTES - 1) & ~(uintptr_t)(SEG_BYTES - 1);
    size_t head = start - (uintptr_t)p, tail = SEG_BYTES - head;
    if (head) munmap(p, head);
    if (tail) munmap((unsigned char *)start + SEG_BYTES, tail);
#if defined(MADV_HUGEPAGE)
    madvise((void *)start, SEG_BYTES, MADV_HUGEPAGE);
#endif
    return (unsigned char *)start;
#else
    if (bytes < SEG_BYTES) return malloc(bytes);
    void *p = NULL;
    if (posix_memalign(&p, SEG_BYTES, SEG_BYTES) != 0) return NULL;
    return p;
#endif
}

static void seg_release(unsigned char *seg, size_t bytes)
{
#if defined(__linux__)
    if (bytes >= SEG_BYTES) {
        munmap(seg, bytes);
        return;
    }
#endif
    (void)bytes;
    free(seg);
}

void fb_arena_destroy(fb_arena *a)
{
    for (uint32_t i = 0; i < a->nsegs; i++)
        if (a->segs[i]) seg_release(a->segs[i], seg_bytes(i));
    free(a->segs);
    free(a->seglive);
    for (uint32_t i = 0; i < a->nbigs; i++)
        if (!((uintptr_t)a->bigs[i] & 1u)) free(a->bigs[i]);
    free(a->bigs);
    memset(a, 0, sizeof *a);
}

static inline uint32_t seg_of(fb_ref r) { return r >> FB_SEG_SHIFT; }

/* The live count of a segment, and the empty-segment bytes that follow it. */
static inline void seg_used(fb_arena *a, uint32_t s, uint32_t units)
{
    if (a->seglive[s] == 0 && s != 0) a->empty -= seg_bytes(s);
    a->seglive[s] += units;
}

static inline void seg_unused(fb_arena *a, uint32_t s, uint32_t units)
{
    a->seglive[s] -= units;
    if (a->seglive[s] == 0 && s != 0) a->empty += seg_bytes(s);
}

static inline uint32_t *next_of(fb_arena *a, fb_ref r) { return (uint32_t *)fb_arena_ptr(a, r); }

static inline void push_free(fb_arena *a, fb_ref r, uint32_t units)
{
    *next_of(a, r) = a->freelist[units];
    a->freelist[units] = r;
    a->nonempty[units / 64] |= 1ull << (units % 64);
}

static inline fb_ref pop_free(fb_arena *a, uint32_t units)
{
    fb_ref r = a->freelist[units];
    a->freelist[units] = *next_of(a, r);
    if (a->freelist[units] == FB_NULLREF) a->nonempty[units / 64] &= ~(1ull << (units % 64));
    return r;
}

static inline unsigned ctz64(uint64_t x)
{
#if defined(__GNUC__) || defined(__clang__)
    return (unsigned)__builtin_ctzll(x);
#else
    unsigned n = 0;
    while (!(x & 1u)) { x >>= 1; n++; }
    return n;
#endif
}

#define NWORDS (sizeof ((fb_arena *)0)->nonempty / sizeof ((fb_arena *)0)->nonempty[0])

/* Smallest size >= from with a free block, or 0. */
static uint32_t next_nonempty(const fb_arena *a, uint32_t from)
{
    for (uint32_t w = from / 64; w < NWORDS; w++) {
        uint64_t bits = a->nonempty[w];
        if (w == from / 64) bits &= ~0ull << (from % 64);
        if (bits) return w * 64 + ctz64(bits);
    }
    return 0;
}

/* Make a new segment the one being carved: a trimmed index if there is one
 * (so that indexes are not used up by churn), else the next.  The rest of
 * the old one, smaller than the request that did not fit (<= MAXUNITS),
 * goes on the free list of its size instead of being wasted. */
static int new_segment(fb_arena *a)
{
    uint32_t i = a->nsegs;
    if (a->ntrimmed) {
        for (i = 1; i < a->nsegs && a->segs[i] != NULL; i++) {}
    } else {
        if (a->nsegs == FB_MAX_SEGS) return -1;
        if (a->nsegs == a->capsegs) {
            uint32_t c = a->capsegs ? a->capsegs * 2 : 16;
            if (c > FB_MAX_SEGS) c = FB_MAX_SEGS;
            unsigned char **s = realloc(a->segs, (size_t)c * sizeof *s);
            if (!s) return -1;
            a->segs = s;
            uint32_t *l = realloc(a->seglive, (size_t)c * sizeof *l);
            if (!l) return -1;
            a->seglive = l;
            a->capsegs = c;
        }
    }
    size_t bytes = seg_bytes(i);
    unsigned char *seg = seg_alloc(bytes);
    if (!seg) return -1;
    if (a->top < a->segcap) push_free(a, (a->cur << FB_SEG_SHIFT) | a->top, a->segcap - a->top);
    if (i == a->nsegs) a->nsegs++;
    else a->ntrimmed--;
    a->segs[i] = seg;
    a->seglive[i] = 0;
    if (i != 0) a->empty += bytes;          /* until the caller carves its block */
    a->reserved += bytes;
    a->cur = i;
    a->top = seg_first(i);
    a->segcap = seg_cap(i);
    return 0;
}

static fb_ref small_alloc(fb_arena *a, uint32_t units)
{
    fb_ref r;
    if (a->freelist[units] != FB_NULLREF) {
        r = pop_free(a, units);
    } else {
        /* Split the best-fitting larger block; prefer one that leaves at
         * least two units, since a one-unit crumb fits no request the trie
         * makes. */
        uint32_t v = next_nonempty(a, units + 2);
        if (!v) v = next_nonempty(a, units + 1);
        if (v) {
            r = pop_free(a, v);
            push_free(a, r + units, v - units);
        } else {
            if (a->top + units > a->segcap && new_segment(a) < 0) return FB_NULLREF;
            r = (a->cur << FB_SEG_SHIFT) | a->top;
            a->top += units;
        }
    }
    seg_used(a, seg_of(r), units);
    a->live += (size_t)units * FB_UNIT;
    return r;
}

static fb_ref big_alloc(fb_arena *a, size_t bytes)
{
    uint32_t idx;
    if (a->bigfree) {
        idx = a->bigfree - 1;
    } else {
        if (a->nbigs == a->capbigs) {
            uint32_t c = a->capbigs ? a->capbigs * 2 : 16;
            if (c > 0x7fffffffu || c < a->capbigs) return FB_NULLREF;
            void **b = realloc(a->bigs, (size_t)c * sizeof *b);
            if (!b) return FB_NULLREF;
            a->bigs = b;
            a->capbigs = c;
        }
        idx = a->nbigs;
    }
    void *p = malloc(bytes + FB_ARENA_SLACK);
    if (!p) return FB_NULLREF;
    if (a->bigfree) a->bigfree = (uint32_t)((uintptr_t)a->bigs[idx] >> 1);
    else a->nbigs++;
    a->bigs[idx] = p;
    a->live += bytes;
    a->reserved += bytes;
    return FB_REF_BIG | idx;
}

fb_ref fb_arena_alloc(fb_arena *a, size_t bytes)
{
    size_t u = units_of(bytes);
    if (u <= FB_ARENA_MAXUNITS) return small_alloc(a, (uint32_t)u);
    return big_alloc(a, u * FB_UNIT);
}

void fb_arena_free(fb_arena *a, fb_ref r, size_t bytes)
{
    if (r == FB_NULLREF) return;
    size_t u = units_of(bytes);
    if (r & FB_REF_BIG) {
        uint32_t idx = r & ~FB_REF_BIG;
        free(a->bigs[idx]);
        a->bigs[idx] = (void *)(((uintptr_t)a->bigfree << 1) | 1u);
        a->bigfree = idx + 1;
        a->live -= u * FB_UNIT;
        a->reserved -= u * FB_UNIT;
        return;
    }
    push_free(a, r, (uint32_t)u);
    seg_unused(a, seg_of(r), (uint32_t)u);
    a->live -= u * FB_UNIT;
}

fb_ref fb_arena_realloc(fb_arena *a, fb_ref r, size_t oldbytes, size_t newbytes)
{
    size_t ou = units_of(oldbytes), nu = units_of(newbytes);
    if (r != FB_NULLREF && ou == nu) return r;
    if (r != FB_NULLREF && (r & FB_REF_BIG) && nu > FB_ARENA_MAXUNITS) {
        uint32_t idx = r & ~FB_REF_BIG;
        void *p = realloc(a->bigs[idx], nu * FB_UNIT + FB_ARENA_SLACK);
        if (!p) return FB_NULLREF;
        a->bigs[idx] = p;
        a->live = a->live - ou * FB_UNIT + nu * FB_UNIT;
        a->reserved = a->reserved - ou * FB_UNIT + nu * FB_UNIT;
        return r;
    }
    fb_ref n = fb_arena_alloc(a, newbytes);
    if (n == FB_NULLREF) return FB_NULLREF;
    if (r != FB_NULLREF) {
        size_t keep = (ou < nu ? ou : nu) * FB_UNIT;
        memcpy(fb_arena_ptr(a, n), fb_arena_ptr(a, r), keep);
        fb_arena_free(a, r, oldbytes);
    }
    return n;
}

/* ------------------------------------------------------------------------ */
/* Trimming                                                                   */

static inline int trimmable(const fb_arena *a, uint32_t s)
{
    return s != 0 && a->segs[s] != NULL && a->seglive[s] == 0;
}

size_t fb_arena_trim(fb_arena *a)
{
    if (a->empty == 0) return 0;
    /* Blocks carry their free-list link inside them: take every block of an
     * empty segment off its list before the segment goes.  Lists are singly
     * linked, hence a walk of all of them. */
    for (uint32_t w = 0; w < NWORDS; w++) {
        uint64_t bits = a->nonempty[w];
        while (bits) {
            uint32_t u = w * 64 + ctz64(bits);
            bits &= bits - 1;
            uint32_t *link = &a->freelist[u];
            while (*link != FB_NULLREF) {
                fb_ref r = *link;
                if (trimmable(a, seg_of(r))) *link = *next_of(a, r);
                else link = next_of(a, r);
            }
            if (a->freelist[u] == FB_NULLREF) a->nonempty[w] &= ~(1ull << (u % 64));
        }
    }
    size_t given = 0;
    for (uint32_t s = 1; s < a->nsegs; s++) {
        if (!trimmable(a, s)) continue;
        size_t bytes = seg_bytes(s);
        seg_release(a->segs[s], bytes);
        a->segs[s] = NULL;
        a->ntrimmed++;
        a->reserved -= bytes;
        a->empty -= bytes;
        given += bytes;
        if (s == a->cur) a->top = a->segcap = 0;   /* the next carve opens a segment */
    }
    return given;
}

size_t fb_arena_maybe_trim(fb_arena *a)
{
    if (a->empty < TRIM_MIN_BYTES || a->empty < a->reserved / 4) return 0;
    return fb_arena_trim(a);
}

/* ------------------------------------------------------------------------ */
/* Audit (tests)                                                              */

const char FB_ARENA_AUDIT_NOMEM[] = "out of memory for the arena audit";

const char *fb_arena_audit_begin(fb_arena_audit *au, const fb_arena *a)
{
    memset(au, 0, sizeof *au);
    au->a = a;
    size_t n = a->nsegs ? a->nsegs : 1, bits = 0;
    au->base = calloc(n, sizeof *au->base);
    au->live = calloc(n, sizeof *au->live);
    for (uint32_t s = 0; s < a->nsegs; s++) {
        au->base[s] = bits;
        if (a->segs[s]) bits += seg_units(s);
    }
    au->map = calloc(bits / 64 + 1, sizeof *au->map);
    if (!au->base || !au->live || !au->map) {
        free(au->base);
        free(au->live);
        free(au->map);
        memset(au, 0, sizeof *au);
        return FB_ARENA_AUDIT_NOMEM;
    }
    return NULL;
}

/* Units of segment s handed out so far: [first, end). */
static uint32_t carved_end(const fb_arena *a, uint32_t s)
{
    return (s == a->cur && a->segcap) ? a->top : seg_cap(s);
}

static const char *mark(fb_arena_audit *au, fb_ref r, uint32_t units, int live)
{
    const fb_arena *a = au->a;
    uint32_t s = seg_of(r), off = r & FB_SEG_MASK;
    if (s >= a->nsegs || a->segs[s] == NULL) return "block in a segment the arena does not hold";
    if (off < seg_first(s) || units == 0 || off + units > carved_end(a, s)) return "block outside the carved units";
    for (uint32_t i = 0; i < units; i++) {
        size_t bit = au->base[s] + off + i;
        if (au->map[bit / 64] & (1ull << (bit % 64))) return live ? "live blocks overlap" : "free block overlaps another";
        au->map[bit / 64] |= 1ull << (bit % 64);
    }
    if (live) au->live[s] += units;
    return NULL;
}

const char *fb_arena_audit_block(fb_arena_audit *au, fb_ref r, size_t bytes)
{
    if (au->err) return au->err;
    if (r == FB_NULLREF) return au->err = "null block reported live";
    if (r & FB_REF_BIG) {
        uint32_t idx = r & ~FB_REF_BIG;
        if (idx >= au->a->nbigs || ((uintptr_t)au->a->bigs[idx] & 1u)) return au->err = "bad big block";
        au->bigs_live += units_of(bytes) * FB_UNIT;
        return NULL;
    }
    if (units_of(bytes) > FB_ARENA_MAXUNITS) return au->err = "small block of a big size";
    return au->err = mark(au, r, (uint32_t)units_of(bytes), 1);
}

const char *fb_arena_audit_end(fb_arena_audit *au)
{
    const fb_arena *a = au->a;
    const char *err = au->err;
    size_t live = au->bigs_live, empty = 0, reserved = 0;
    uint32_t trimmed = 0;
    /* The free lists: marked too, and the bitmap of non-empty lists right. */
    for (uint32_t u = 1; u <= FB_ARENA_MAXUNITS && !err; u++) {
        int listed = (a->nonempty[u / 64] >> (u % 64)) & 1u;
        if (listed != (a->freelist[u] != FB_NULLREF)) err = "non-empty bitmap differs from the free lists";
        /* A cycle marks a block twice: reported as an overlap. */
        fb_ref r = a->freelist[u];
        while (r != FB_NULLREF && !err) {
            err = (r & FB_REF_BIG) ? "big ref on a free list" : mark(au, r, u, 0);
            if (!err) r = *(const uint32_t *)fb_arena_ptr(a, r);
        }
    }
    if (a->freelist[0] != FB_NULLREF && !err) err = "block on the free list of size 0";
    /* Every carved unit is live or free, exactly once; counts per segment. */
    for (uint32_t s = 0; s < a->nsegs && !err; s++) {
        if (a->segs[s] == NULL) {
            trimmed++;
            if (s == 0) err = "segment 0 trimmed";
            continue;
        }
        reserved += seg_bytes(s);
        if (au->live[s] != a->seglive[s]) err = "segment live count differs from its live blocks";
        if (a->seglive[s] == 0 && s != 0) empty += seg_bytes(s);
        live += (size_t)au->live[s] * FB_UNIT;
        for (uint32_t off = seg_first(s); off < carved_end(a, s) && !err; off++) {
            size_t bit = au->base[s] + off;
            if (!(au->map[bit / 64] & (1ull << (bit % 64)))) err = "carved unit neither live nor free (leaked)";
        }
    }
    if (!err && live != a->live) err = "live bytes differ from the live blocks";
    if (!err && empty != a->empty) err = "empty-segment bytes differ";
    if (!err && trimmed != a->ntrimmed) err = "trimmed-segment count differs";
    /* A big block holds as many bytes as it is reported live. */
    if (!err && reserved + au->bigs_live != a->reserved) err = "reserved bytes differ";
    if (!err && a->segcap && (a->cur >= a->nsegs || a->segs[a->cur] == NULL)) err = "carving a segment not held";
    free(au->base);
    free(au->live);
    free(au->map);
    memset(au, 0, sizeof *au);
    return err;
}
