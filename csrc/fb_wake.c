/* fb_wake.c - see fb_wake.h. */
#define _POSIX_C_SOURCE 200809L
#include "fb_wake.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

static void poke(int fd)
{
    char b = 0;
    ssize_t w = write(fd, &b, 1);
    (void)w;   /* a full pipe is a wake-up already pending */
}

static int prepare(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    return fcntl(fd, F_SETFD, FD_CLOEXEC);
}

int fb_wake_open(fb_wake *k, int owner_fd)
{
    int fds[2];
    if (pipe(fds) != 0) return errno;
    int owner = -1;
    if (prepare(fds[0]) < 0 || prepare(fds[1]) < 0 || (owner = fcntl(owner_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return e;
    }
    k->r = fds[0];
    k->w = fds[1];
    k->owner = owner;
    k->signaled = 0;
    return 0;
}

void fb_wake_close(fb_wake *k)
{
    close(k->r);
    close(k->w);
    close(k->owner);
    k->r = k->w = k->owner = -1;
}

void fb_wake_signal(fb_wake *k)
{
    if (!__atomic_exchange_n(&k->signaled, 1, __ATOMIC_SEQ_CST)) poke(k->w);
}

void fb_wake_force(fb_wake *k)
{
    poke(k->w);
}

void fb_wake_clear(fb_wake *k)
{
    char drain[64];
    while (read(k->r, drain, sizeof drain) > 0) {
    }
    __atomic_store_n(&k->signaled, 0, __ATOMIC_SEQ_CST);
}

void fb_wake_owner(fb_wake *k)
{
    poke(k->owner);
}
