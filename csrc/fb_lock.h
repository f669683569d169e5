/*
 * fb_lock.h - a minimal lock for code that wraps the core (the Python
 * bindings use one per object).
 *
 * Uncontended, taking and releasing it is one atomic exchange and one store
 * (a few ns, against ~20 ns for each operation of a pthread-based lock), and
 * these locks are almost never contended: each guards one object that threads
 * rarely share.  A waiter yields the CPU between attempts; callers must not
 * hold anything the lock holder needs (the bindings release the GIL before
 * waiting).
 */
#ifndef FB_LOCK_H
#define FB_LOCK_H

#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
#include <windows.h>
typedef struct fb_lock { volatile long held; } fb_lock;
static inline int fb_lock_try(fb_lock *l) { return _InterlockedExchange(&l->held, 1) == 0; }
static inline void fb_lock_release(fb_lock *l) { _InterlockedExchange(&l->held, 0); }
static inline void fb_lock_yield(void) { SwitchToThread(); }
#else
#include <sched.h>
typedef struct fb_lock { int held; } fb_lock;
static inline int fb_lock_try(fb_lock *l) { return __atomic_exchange_n(&l->held, 1, __ATOMIC_ACQUIRE) == 0; }
static inline void fb_lock_release(fb_lock *l) { __atomic_store_n(&l->held, 0, __ATOMIC_RELEASE); }
static inline void fb_lock_yield(void) { sched_yield(); }
#endif

/* Block until the lock is ours. */
static inline void fb_lock_wait(fb_lock *l)
{
    for (int spins = 0; !fb_lock_try(l); spins++)
        if (spins > 64) fb_lock_yield();
}

#endif /* FB_LOCK_H */
