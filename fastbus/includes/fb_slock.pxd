# Mirrors csrc/fb_slock.h
from libc.stdint cimport int64_t

cdef extern from "fb_slock.h" nogil:
    ctypedef struct fb_slock:
        int held
        int waiters
    int fb_slock_init(fb_slock *l)
    void fb_slock_destroy(fb_slock *l)
    bint fb_slock_try(fb_slock *l)
    bint fb_slock_held(const fb_slock *l)
    bint fb_slock_wait(fb_slock *l, int64_t timeout_ns)
    int fb_slock_release(fb_slock *l)
