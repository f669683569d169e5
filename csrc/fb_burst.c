/* fb_burst.c - see fb_burst.h. */
#include "fb_burst.h"

void fb_burst_init(fb_burst *b, uint64_t gap_ns, int burst_limit)
{
    b->last_send_ns = 0;
    b->streak = 0;
    b->burst_limit = burst_limit < 0 ? 0 : burst_limit;
    b->gap_ns = gap_ns;
}

void fb_burst_sent(fb_burst *b, int busy, uint64_t now)
{
    __atomic_store_n(&b->last_send_ns, now, __ATOMIC_RELAXED);
    int streak = __atomic_load_n(&b->streak, __ATOMIC_RELAXED);
    if (busy) streak = b->burst_limit;
    else if (streak < b->burst_limit) streak++;
    __atomic_store_n(&b->streak, streak, __ATOMIC_RELAXED);
}

static int gap_passed(const fb_burst *b, uint64_t now)
{
    uint64_t last = __atomic_load_n(&b->last_send_ns, __ATOMIC_RELAXED);
    return now < last || now - last >= b->gap_ns;     /* (a clock read before the last send: as passed) */
}

int fb_burst_starts_idle(fb_burst *b, uint64_t now)
{
    if (gap_passed(b, now)) __atomic_store_n(&b->streak, 0, __ATOMIC_RELAXED);
    return __atomic_load_n(&b->streak, __ATOMIC_RELAXED) < b->burst_limit;
}

int fb_burst_idle(const fb_burst *b, uint64_t now)
{
    return gap_passed(b, now) || __atomic_load_n(&b->streak, __ATOMIC_RELAXED) < b->burst_limit;
}

uint64_t fb_burst_linger_due(const fb_burst *b, uint64_t linger_ns, uint64_t now)
{
    uint64_t last = __atomic_load_n(&b->last_send_ns, __ATOMIC_RELAXED);
    if (!linger_ns || !last || now >= last + linger_ns) return 0;
    return last + linger_ns;
}
