/* fb_slock.c - see fb_slock.h. */
#define _POSIX_C_SOURCE 200809L
#include "fb_slock.h"

#include <errno.h>
#include <time.h>

int fb_slock_init(fb_slock *l)
{
    l->held = 0;
    l->waiters = 0;
    int rc = pthread_mutex_init(&l->m, NULL);
    if (rc) return rc;
    rc = pthread_cond_init(&l->c, NULL);
    if (rc) pthread_mutex_destroy(&l->m);
    return rc;
}

void fb_slock_destroy(fb_slock *l)
{
    pthread_cond_destroy(&l->c);
    pthread_mutex_destroy(&l->m);
}

int fb_slock_wait(fb_slock *l, int64_t timeout_ns)
{
    if (fb_slock_try(l)) return 1;
    if (timeout_ns == 0) return 0;
    /* The deadline on the clock the condition variable uses (CLOCK_REALTIME
     * everywhere; a clock step shortens or stretches one wait, no more). */
    struct timespec until;
    if (timeout_ns > 0) {
        clock_gettime(CLOCK_REALTIME, &until);
        int64_t ns = until.tv_nsec + timeout_ns % 1000000000;
        until.tv_sec += (time_t)(timeout_ns / 1000000000 + ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
    }
    int got = 0;
    pthread_mutex_lock(&l->m);
    /* Counted before the next try: a release either sees us and signals
     * (under m, so not before we wait), or came before our try, which then
     * succeeds.  No wake-up is lost. */
    __atomic_add_fetch(&l->waiters, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        if (fb_slock_try(l)) {
            got = 1;
            break;
        }
        int rc = timeout_ns < 0 ? pthread_cond_wait(&l->c, &l->m) : pthread_cond_timedwait(&l->c, &l->m, &until);
        if (rc == ETIMEDOUT) {
            got = fb_slock_try(l);
            break;
        }
    }
    __atomic_sub_fetch(&l->waiters, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&l->m);
    return got;
}

int fb_slock_release(fb_slock *l)
{
    if (!__atomic_exchange_n(&l->held, 0, __ATOMIC_SEQ_CST)) return -1;
    if (__atomic_load_n(&l->waiters, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&l->m);
        pthread_cond_signal(&l->c);
        pthread_mutex_unlock(&l->m);
    }
    return 0;
}
