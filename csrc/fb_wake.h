/*
 * fb_wake.h - how the client's native threads (fb_sender.h, fb_reader.h)
 * are woken, and how they wake their owner.
 *
 * A thread sleeps in poll() on the read end of its own pipe; anyone wakes
 * it with one byte (at most one pending: `signaled`).  Its owner (the
 * client's Python keeper) is woken the same way on a descriptor the owner
 * gives; the thread writes to its own copy of it, because the owner may
 * close its descriptor before the thread stops (a number reused meanwhile
 * would get our bytes).
 */
#ifndef FB_WAKE_H
#define FB_WAKE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_wake {
    int r, w;          /* the thread's pipe (non-blocking, close-on-exec) */
    int owner;         /* our copy of the owner's descriptor */
    int signaled;      /* a byte is pending on the pipe (atomic) */
} fb_wake;

/* Open the pipe and copy owner_fd.  0, or an errno (nothing left open). */
int fb_wake_open(fb_wake *k, int owner_fd);
void fb_wake_close(fb_wake *k);

/* Wake the thread (any thread; one write while a wake-up is pending). */
void fb_wake_signal(fb_wake *k);
/* Wake it even if a wake-up is pending (to stop it). */
void fb_wake_force(fb_wake *k);
/* In the thread, after poll(): empty the pipe; later signals write again. */
void fb_wake_clear(fb_wake *k);
/* Wake the owner. */
void fb_wake_owner(fb_wake *k);

#ifdef __cplusplus
}
#endif
#endif /* FB_WAKE_H */
