/* fb_arena.c - segmented arena with 32-bit refs (see fb_arena.h). */
#define _DEFAULT_SOURCE 1 /* madvise */
#include "fb_arena.h"

#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define SEG_BYTES ((size_t)FB_SEG_UNITS * FB_UNIT)
#define SEG_FIRST_UNITS 4096u /* 32 KiB: a small table stays small */

/* Segment i holds min(32 KiB << i, 2 MiB): a trie with a handful of keys
 * costs tens of KiB, not a huge page, while a big one soon reaches full-size,
 * huge-page-backed segments.  Addresses never move, so refs stay
 * (segment, offset) with a fixed 18-bit offset. */
static uint32_t seg_units(uint32_t i)
{
    return i >= 6 ? FB_SEG_UNITS : SEG_FIRST_UNITS << i;
}

static size_t units_of(size_t bytes)
{
    size_t u = (bytes + FB_UNIT - 1) / FB_UNIT;
    return u ? u : 1;
}

void fb_arena_init(fb_arena *a) { memset(a, 0, sizeof *a); }

void fb_arena_destroy(fb_arena *a)
{
    for (uint32_t i = 0; i < a->nsegs; i++) free(a->segs[i]);
    free(a->segs);
    for (uint32_t i = 0; i < a->nbigs; i++)
        if (!((uintptr_t)a->bigs[i] & 1u)) free(a->bigs[i]);
    free(a->bigs);
    memset(a, 0, sizeof *a);
}

/* Segments are aligned to, and as large as, a 2 MiB huge page.  A big trie
 * is walked at random: with 4 KiB pages nearly every node visit would also
 * miss the TLB.  Where the kernel offers transparent huge pages on request,
 * ask for them; elsewhere this is an ordinary aligned allocation. */
static unsigned char *seg_alloc(size_t bytes)
{
#if defined(_WIN32)
    return malloc(bytes);
#else
    if (bytes < SEG_BYTES) return malloc(bytes);
    void *p = NULL;
    if (posix_memalign(&p, SEG_BYTES, SEG_BYTES) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, SEG_BYTES, MADV_HUGEPAGE);
#endif
    return p;
#endif
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

/* Smallest size >= from with a free block, or 0. */
static uint32_t next_nonempty(const fb_arena *a, uint32_t from)
{
    for (uint32_t w = from / 64; w < sizeof a->nonempty / sizeof a->nonempty[0]; w++) {
        uint64_t bits = a->nonempty[w];
        if (w == from / 64) bits &= ~0ull << (from % 64);
        if (bits) return w * 64 + ctz64(bits);
    }
    return 0;
}

static fb_ref small_alloc(fb_arena *a, uint32_t units)
{
    if (a->freelist[units] != FB_NULLREF) {
        a->live += (size_t)units * FB_UNIT;
        return pop_free(a, units);
    }
    /* Split the best-fitting larger block; prefer one that leaves at least two
     * units, since a one-unit crumb fits no request the trie makes. */
    uint32_t v = next_nonempty(a, units + 2);
    if (!v) v = next_nonempty(a, units + 1);
    if (v) {
        fb_ref r = pop_free(a, v);
        push_free(a, r + units, v - units);
        a->live += (size_t)units * FB_UNIT;
        return r;
    }
    if (a->nsegs == 0 || a->top + units > a->segcap) {
        if (a->nsegs == FB_MAX_SEGS) return FB_NULLREF;
        if (a->nsegs == a->capsegs) {
            uint32_t c = a->capsegs ? a->capsegs * 2 : 16;
            if (c > FB_MAX_SEGS) c = FB_MAX_SEGS;
            unsigned char **s = realloc(a->segs, (size_t)c * sizeof *s);
            if (!s) return FB_NULLREF;
            a->segs = s;
            a->capsegs = c;
        }
        size_t bytes = (size_t)seg_units(a->nsegs) * FB_UNIT;
        unsigned char *seg = seg_alloc(bytes);
        if (!seg) return FB_NULLREF;
        if (a->nsegs > 0 && a->top < a->segcap) {
            /* The tail of the old segment is smaller than `units` <= MAXUNITS:
             * keep it on the free list of its size instead of wasting it. */
            uint32_t tail = a->segcap - a->top;
            push_free(a, ((a->nsegs - 1) << FB_SEG_SHIFT) | a->top, tail);
        }
        a->segs[a->nsegs++] = seg;
        a->reserved += bytes;
        /* The last FB_ARENA_SLACK bytes are never handed out. */
        a->segcap = (uint32_t)(bytes / FB_UNIT) - FB_ARENA_SLACK / FB_UNIT;
        /* Unit 0 of segment 0 is never handed out, so ref 0 can mean NULL. */
        a->top = (a->nsegs == 1) ? 1 : 0;
    }
    fb_ref r2 = ((a->nsegs - 1) << FB_SEG_SHIFT) | a->top;
    a->top += units;
    a->live += (size_t)units * FB_UNIT;
    return r2;
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
