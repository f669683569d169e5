/*
 * fb_arena.h - internal: a segmented arena addressed by 32-bit references.
 *
 * Why: the trie holds millions of small nodes.  malloc costs 8-16 bytes of
 * header and rounding per block, and 8-byte pointers double the size of child
 * tables.  Here blocks are carved from 2 MiB segments in 8-byte units with no
 * header, and a block is named by a 32-bit ref (segment index, unit offset).
 * Freed blocks go to a free list per size.  Because blocks carry no header,
 * any free block can be split: a request that finds its own list empty takes
 * the smallest larger free block and returns the rest to the list of its size
 * (best fit, found through a bitmap of non-empty lists).  So memory freed by
 * nodes that grew is reused by any smaller request, and subscribe/unsubscribe
 * churn does not grow the footprint.
 *
 * Blocks above FB_ARENA_MAXUNITS units (4 KiB: nodes of very long keys, index
 * arrays of subscribers with hundreds of keys) are malloc'd and named by a ref
 * with the top bit set, indexing a table of pointers.  Such a block keeps its
 * ref when it is resized.
 *
 * The caller remembers the size of each block (the trie can always recompute
 * it from a node header), which is what lets blocks carry no header.
 *
 * Giving memory back: each segment counts the units of its live blocks.  A
 * segment whose count falls to zero holds only free blocks; fb_arena_trim()
 * takes those blocks off the free lists and returns the segment to the
 * system (munmap on Linux, so the pages really leave the process; free()
 * elsewhere).  Its index is reused by the next segment the arena needs, so
 * refs stay (segment, offset) and churn cannot run out of indexes.
 * fb_arena_maybe_trim() trims only when empty segments are a quarter of what
 * the arena holds: the free-list walk it costs is then paid for by the frees
 * that emptied them.  Segment 0 (which holds the unit that ref 0 names) is
 * never trimmed.
 *
 * Not thread-safe: the owner serialises access.
 */
#ifndef FB_ARENA_H
#define FB_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef uint32_t fb_ref;
#define FB_NULLREF 0u

#define FB_UNIT 8u
#define FB_SEG_SHIFT 18u                       /* 2^18 units = 2 MiB, the largest segment */
#define FB_SEG_UNITS (1u << FB_SEG_SHIFT)
#define FB_SEG_MASK (FB_SEG_UNITS - 1u)
#define FB_REF_BIG 0x80000000u
#define FB_MAX_SEGS (1u << (31u - FB_SEG_SHIFT)) /* 8192 segments = 16 GiB */
#define FB_ARENA_MAXUNITS 512u                  /* 4 KiB; larger blocks are malloc'd */
/* Bytes after any block that are always mapped: a reader may load up to this
 * many bytes starting anywhere inside a block (e.g. 16 labels at once with
 * SIMD) without leaving its allocation.  Segments keep their last
 * FB_ARENA_SLACK bytes unused; big blocks are allocated this much larger. */
#define FB_ARENA_SLACK 16u

typedef struct fb_arena {
    unsigned char **segs;                       /* NULL: a trimmed segment, its index free */
    uint32_t *seglive;                          /* units in live blocks, per segment */
    uint32_t nsegs, capsegs;
    uint32_t ntrimmed;                          /* indexes below nsegs whose segment was trimmed */
    uint32_t cur;                               /* the segment being carved */
    uint32_t top;                               /* units carved from segment cur */
    uint32_t segcap;                            /* units segment cur can hand out (0: none) */
    size_t empty;                               /* bytes of held segments (not 0) with no live block */
    uint32_t freelist[FB_ARENA_MAXUNITS + 1];   /* head ref per size in units */
    uint64_t nonempty[(FB_ARENA_MAXUNITS + 64) / 64]; /* bit u: freelist[u] has a block */
    void **bigs;                                /* big block pointers; free slots tagged */
    uint32_t nbigs, capbigs;
    uint32_t bigfree;                           /* 1 + index of a free big slot, 0 = none */
    size_t live;                                /* bytes in live blocks */
    size_t reserved;                            /* bytes held from malloc */
} fb_arena;

void fb_arena_init(fb_arena *a);
void fb_arena_destroy(fb_arena *a);

/* A block of at least `bytes` bytes (8-byte aligned); FB_NULLREF when out of
 * memory.  Contents are undefined. */
fb_ref fb_arena_alloc(fb_arena *a, size_t bytes);
void fb_arena_free(fb_arena *a, fb_ref r, size_t bytes);
/* Resize keeping the first min(old, new) bytes.  Returns the (possibly new)
 * ref, or FB_NULLREF with the old block untouched when out of memory. */
fb_ref fb_arena_realloc(fb_arena *a, fb_ref r, size_t oldbytes, size_t newbytes);

/* Return every segment without live blocks (but segment 0) to the system.
 * Returns the bytes given back.  Cost: a walk of the free lists. */
size_t fb_arena_trim(fb_arena *a);
/* fb_arena_trim() if the empty segments are at least a quarter of the
 * arena's bytes (and at least 64 KiB): cheap to call after every free. */
size_t fb_arena_maybe_trim(fb_arena *a);

/* For tests (fb_trie_check): verify the arena against its owner's account
 * of the live blocks.  Begin, report every live block with its size, end.
 * End checks that the live and free blocks tile every carved unit exactly
 * once (no overlap, no unit lost to a wrong size), that each segment's live
 * count matches, and the free lists and counters.  Returns NULL if all
 * holds, else a static description; FB_ARENA_AUDIT_NOMEM if it could not
 * allocate its map.  A block that overlaps another or lies outside the
 * carved units makes fb_arena_audit_block() return that description too. */
typedef struct fb_arena_audit {
    const struct fb_arena *a;
    uint64_t *map;                              /* a bit per unit, segment after segment */
    size_t *base;                               /* first bit of each segment in map */
    uint32_t *live;                             /* units reported live, per segment */
    size_t bigs_live;                           /* bytes of big blocks reported */
    const char *err;                            /* first problem found */
} fb_arena_audit;
extern const char FB_ARENA_AUDIT_NOMEM[];
const char *fb_arena_audit_begin(fb_arena_audit *au, const fb_arena *a);
const char *fb_arena_audit_block(fb_arena_audit *au, fb_ref r, size_t bytes);
const char *fb_arena_audit_end(fb_arena_audit *au);

static inline void *fb_arena_ptr(const fb_arena *a, fb_ref r)
{
    if (r & FB_REF_BIG) return a->bigs[r & ~FB_REF_BIG];
    return a->segs[r >> FB_SEG_SHIFT] + ((size_t)(r & FB_SEG_MASK) * FB_UNIT);
}

#endif /* FB_ARENA_H */
