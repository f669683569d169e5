# Mirrors csrc/fb_lock.h
cdef extern from "fb_lock.h" nogil:
    ctypedef struct fb_lock:
        int held
    bint fb_lock_try(fb_lock *l)
    void fb_lock_release(fb_lock *l)
    void fb_lock_wait(fb_lock *l)
