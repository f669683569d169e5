/* Tests of fb_arena: random alloc/free/realloc against a list of live blocks
 * (contents checked), trimming of empty segments, reuse of their indexes. */
#include "ctest.h"
#include "fb_arena.h"

typedef struct blk { fb_ref r; size_t bytes; unsigned char tag; } blk;

/* Fill a block with a pattern derived from its tag, and check it back. */
static void fill(fb_arena *a, const blk *b)
{
    unsigned char *p = fb_arena_ptr(a, b->r);
    for (size_t i = 0; i < b->bytes; i++) p[i] = (unsigned char)(b->tag + i * 7u);
}

static int intact(fb_arena *a, const blk *b)
{
    const unsigned char *p = fb_arena_ptr(a, b->r);
    for (size_t i = 0; i < b->bytes; i++)
        if (p[i] != (unsigned char)(b->tag + i * 7u)) return 0;
    return 1;
}

/* The arena's audit, with the live blocks the test holds. */
static void audit(fb_arena *a, const blk *bs, size_t n, int line)
{
    fb_arena_audit au;
    const char *err = fb_arena_audit_begin(&au, a);
    REQUIRE(err == NULL);
    for (size_t i = 0; i < n && !err; i++) err = fb_arena_audit_block(&au, bs[i].r, bs[i].bytes);
    const char *end = fb_arena_audit_end(&au);
    if (!err) err = end;
    if (err) {
        fprintf(stderr, "line %d: arena audit: %s\n", line, err);
        exit(1);
    }
}
#define AUDIT(a, bs, n) audit(a, bs, n, __LINE__)

static size_t rnd_size(void)
{
    unsigned k = rndn(100);
    if (k < 80) return 1 + rndn(96);         /* trie nodes */
    if (k < 98) return 1 + rndn(4096);       /* up to the largest small block */
    return 4097 + rndn(20000);               /* big blocks */
}

static void test_random_with_trim(void)
{
    fb_arena a;
    fb_arena_init(&a);
    size_t cap = 60000, n = 0;
    blk *bs = malloc(cap * sizeof *bs);
    REQUIRE(bs);
    unsigned char tag = 1;
    size_t given = 0, peak = 0;
    for (int round = 0; round < 6; round++) {
        /* Grow well past the small segments, then shrink to a few blocks:
         * whole segments empty out and are trimmed, then refilled. */
        size_t target = round % 2 ? 200 : cap;
        for (int step = 0; step < 120000; step++) {
            unsigned op = rndn(10);
            if ((n < target && op < 6) || n == 0) {
                blk b = { FB_NULLREF, rnd_size(), tag++ };
                b.r = fb_arena_alloc(&a, b.bytes);
                REQUIRE(b.r != FB_NULLREF);
                fill(&a, &b);
                bs[n++] = b;
            } else if (op < 9 || n > target) {
                /* Shrinking, mostly the newest blocks go (as when the
                 * subscriber that subscribed last leaves), so that whole
                 * segments empty out: only those are given back. */
                size_t i = (n > target && rndn(10)) ? n - 1 : rndn((unsigned)n);
                CHECK(intact(&a, &bs[i]));
                fb_arena_free(&a, bs[i].r, bs[i].bytes);
                bs[i] = bs[--n];
                given += fb_arena_maybe_trim(&a);
            } else {
                size_t i = rndn((unsigned)n);
                CHECK(intact(&a, &bs[i]));
                size_t nb = rnd_size();
                fb_ref r = fb_arena_realloc(&a, bs[i].r, bs[i].bytes, nb);
                REQUIRE(r != FB_NULLREF);
                blk b = { r, nb < bs[i].bytes ? nb : bs[i].bytes, bs[i].tag };
                CHECK(intact(&a, &b));    /* the kept prefix moved with the block */
                bs[i] = (blk){ r, nb, tag++ };
                fill(&a, &bs[i]);
            }
            if (step % 20000 == 0) AUDIT(&a, bs, n);
            if (a.reserved > peak) peak = a.reserved;
        }
        /* Shrunk with the blocks, though survivors scattered by the random
         * frees of the growing rounds pin about half the segments. */
        if (round % 2) CHECK(a.reserved < peak * 3 / 4);
        AUDIT(&a, bs, n);
        for (size_t i = 0; i < n; i++) CHECK(intact(&a, &bs[i]));
    }
    CHECK(given > peak / 4);                 /* trimmed in the shrinking rounds */
    CHECK(a.nsegs <= 64);                    /* trimmed indexes were reused */
    while (n) {
        n--;
        fb_arena_free(&a, bs[n].r, bs[n].bytes);
    }
    fb_arena_trim(&a);
    AUDIT(&a, bs, 0);
    CHECK_EQ(a.live, 0);
    CHECK(a.reserved <= 32 * 1024);          /* segment 0 only */
    free(bs);
    fb_arena_destroy(&a);
}

/* Fill many full-size segments, free all but one block per segment, then the
 * rest: segments are given back exactly when their last block goes. */
static void test_trim_follows_last_block(void)
{
    fb_arena a;
    fb_arena_init(&a);
    size_t n = 200000, keep = 0;
    blk *bs = malloc(n * sizeof *bs);
    REQUIRE(bs);
    for (size_t i = 0; i < n; i++) {
        bs[i] = (blk){ fb_arena_alloc(&a, 64), 64, (unsigned char)i };
        REQUIRE(bs[i].r != FB_NULLREF);
        fill(&a, &bs[i]);
    }
    size_t full = a.reserved;
    CHECK(full >= n * 64);
    uint32_t segs = a.nsegs;
    /* Keep the first block of every segment. */
    uint32_t last_seg = UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = bs[i].r >> FB_SEG_SHIFT;
        if (s != last_seg) {
            last_seg = s;
            bs[keep++] = bs[i];
        } else {
            fb_arena_free(&a, bs[i].r, bs[i].bytes);
        }
    }
    CHECK_EQ(keep, segs);
    CHECK_EQ(a.empty, 0);
    CHECK_EQ(fb_arena_trim(&a), 0);          /* every segment still has a live block */
    CHECK_EQ(a.reserved, full);
    AUDIT(&a, bs, keep);
    /* Now the kept blocks go, all but segment 0's. */
    for (size_t i = 1; i < keep; i++) fb_arena_free(&a, bs[i].r, bs[i].bytes);
    CHECK(fb_arena_maybe_trim(&a) > 0);
    CHECK(a.reserved <= 32 * 1024);
    CHECK_EQ(a.ntrimmed, segs - 1);
    CHECK(intact(&a, &bs[0]));
    AUDIT(&a, bs, 1);
    /* Refill: trimmed indexes come back, in order, before new ones. */
    for (size_t i = 1; i < n; i++) {
        bs[i] = (blk){ fb_arena_alloc(&a, 64), 64, (unsigned char)(i * 3) };
        REQUIRE(bs[i].r != FB_NULLREF);
        fill(&a, &bs[i]);
    }
    CHECK_EQ(a.nsegs, segs);
    CHECK_EQ(a.ntrimmed, 0);
    AUDIT(&a, bs, n);
    for (size_t i = 0; i < n; i++) CHECK(intact(&a, &bs[i]));
    free(bs);
    fb_arena_destroy(&a);
}

/* maybe_trim waits until empty segments are a quarter of the arena. */
static void test_maybe_trim_threshold(void)
{
    fb_arena a;
    fb_arena_init(&a);
    enum { N = 400000 };
    static fb_ref rs[N];
    for (int i = 0; i < N; i++) rs[i] = fb_arena_alloc(&a, 48);
    size_t full = a.reserved;
    CHECK(full > 16u << 20);
    /* Free the blocks of the newest segment: one empty segment, far less
     * than a quarter of the arena. */
    uint32_t lastseg = rs[N - 1] >> FB_SEG_SHIFT;
    int i = N - 1;
    for (; i >= 0 && (rs[i] >> FB_SEG_SHIFT) == lastseg; i--) fb_arena_free(&a, rs[i], 48);
    CHECK(a.empty > 0);
    CHECK_EQ(fb_arena_maybe_trim(&a), 0);
    CHECK_EQ(a.reserved, full);
    /* Down to half: now it trims, every empty segment at once. */
    for (; i >= N / 2; i--) fb_arena_free(&a, rs[i], 48);
    CHECK(fb_arena_maybe_trim(&a) > 0);
    CHECK(a.reserved < full * 6 / 10);
    CHECK_EQ(a.empty, 0);
    for (; i >= 0; i--) fb_arena_free(&a, rs[i], 48);
    CHECK_EQ(a.live, 0);
    fb_arena_destroy(&a);
}

int main(void)
{
    RUN(test_random_with_trim);
    RUN(test_trim_follows_last_block);
    RUN(test_maybe_trim_threshold);
    CTEST_END();
}
