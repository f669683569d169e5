# Mirrors csrc/fb_wake.h
cdef extern from "fb_wake.h" nogil:
    ctypedef struct fb_wake:
        int r
        int w
        int owner
        int signaled

    int fb_wake_open(fb_wake *k, int owner_fd)
    void fb_wake_close(fb_wake *k)
    void fb_wake_signal(fb_wake *k)
    void fb_wake_force(fb_wake *k)
    void fb_wake_clear(fb_wake *k)
    void fb_wake_owner(fb_wake *k)
