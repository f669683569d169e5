/*
 * fb_slock.h - a lock for a resource that native threads and Python threads
 * share: a client's connection to the broker (its ZeroMQ socket).
 *
 * fb_lock (fb_lock.h) spins, which is right for a few instructions under it;
 * a connection is held for a send, a read, or a whole wait for the broker,
 * so a waiter here sleeps.  Taking a free lock is one atomic exchange, as
 * with fb_lock; a waiter blocks on a condition variable.  Any thread may
 * release it (as Python's threading.Lock), and a native thread (fb_sender)
 * waits for it without ever taking Python's interpreter lock: the Python
 * bindings release that before they wait.
 */
#ifndef FB_SLOCK_H
#define FB_SLOCK_H

#include <pthread.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_slock {
    int held;          /* 1 while someone holds it (atomic) */
    int waiters;       /* threads blocked in fb_slock_wait (atomic; changed under m) */
    pthread_mutex_t m;
    pthread_cond_t c;
} fb_slock;

/* 0, or an errno from pthread (then the lock is unusable). */
int fb_slock_init(fb_slock *l);
void fb_slock_destroy(fb_slock *l);

/* Take it if it is free: 1 if taken, 0 if not. */
static inline int fb_slock_try(fb_slock *l)
{
    return __atomic_exchange_n(&l->held, 1, __ATOMIC_SEQ_CST) == 0;
}

static inline int fb_slock_held(const fb_slock *l)
{
    return __atomic_load_n(&l->held, __ATOMIC_SEQ_CST);
}

/* Take it, waiting at most timeout_ns (< 0: for ever): 1 if taken, 0 if
 * the time ran out. */
int fb_slock_wait(fb_slock *l, int64_t timeout_ns);

/* Let go (from any thread); wakes one waiter.  Returns 0, or -1 if it was
 * not held (nothing changed). */
int fb_slock_release(fb_slock *l);

#ifdef __cplusplus
}
#endif
#endif /* FB_SLOCK_H */
