/*
 * fb_resolve.h - a host name looked up again, off the caller's thread.
 *
 * Why: a client's connection (fb_zmtp.h) is given a struct sockaddr, made
 * from its endpoint's host name once.  When the service behind the name
 * moves (a container restarted elsewhere, a DNS record changed), the old
 * address is wrong for good, and a connection that kept reconnecting to it
 * would never reach the service again; libzmq looks the name up at each
 * reconnect.  A lookup may take seconds (a DNS server that does not
 * answer), and the thread that reconnects is a caller's (a publish(), a
 * read): so the lookup runs in a short-lived thread of its own, started
 * when a connection is lost, and the reconnect takes its answer when it is
 * there (the interval before a reconnect, 100 ms at first, is usually
 * longer than a lookup); until then, or if the lookup fails, the last
 * address found is used again.
 *
 * Thread-safe between the owner and its lookup thread; the owner is one
 * caller at a time (fb_zmtp's rule).  The lookup thread never touches
 * anything but this object, which it frees if the owner let it go first.
 */
#ifndef FB_RESOLVE_H
#define FB_RESOLVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_resolver fb_resolver;

typedef struct fb_resolver_stats {
    uint64_t lookups;            /* lookups finished */
    uint64_t failures;           /* ... that found nothing (the last address kept) */
    uint64_t changes;            /* ... whose address differed from the one in use */
} fb_resolver_stats;

/* `host` (a name; copied) at `port`, its answers of the first family
 * getaddrinfo gives (as the endpoint's first lookup took).  NULL on ENOMEM
 * or a host longer than 253 bytes. */
fb_resolver *fb_resolver_new(const char *host, uint16_t port);
/* Start a lookup unless one runs already.  0, or -1 with errno (no thread
 * could be made: nothing changes, the last address stays in use). */
int fb_resolver_start(fb_resolver *r);
/* If a lookup finished since the last call with an address that differs
 * from `addr` (a struct sockaddr of *len bytes, in and out, room for
 * `cap`), write it there and return 1; otherwise 0. */
int fb_resolver_take(fb_resolver *r, void *addr, size_t *len, size_t cap);
void fb_resolver_get_stats(fb_resolver *r, fb_resolver_stats *out);
/* Let go: a lookup still running frees it when it ends. */
void fb_resolver_free(fb_resolver *r);

#ifdef __cplusplus
}
#endif

#endif
