/* fb_resolve.c - see fb_resolve.h. */
#define _GNU_SOURCE
#include "fb_resolve.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

struct fb_resolver {
    pthread_mutex_t mu;
    int refs;                    /* the owner's, and a running lookup's */
    int running;
    int fresh;                   /* a lookup found `found` and nobody took it yet */
    char host[254];
    char port[8];
    struct sockaddr_storage found;
    socklen_t found_len;
    fb_resolver_stats st;
};

static void unref(fb_resolver *r)
{
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) {
        pthread_mutex_destroy(&r->mu);
        free(r);
    }
}

static void *lookup(void *arg)
{
    fb_resolver *r = arg;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(r->host, r->port, &hints, &res);
    pthread_mutex_lock(&r->mu);
    r->st.lookups++;
    if (rc != 0 || !res || res->ai_addrlen > sizeof r->found) {
        r->st.failures++;
    } else {
        memcpy(&r->found, res->ai_addr, res->ai_addrlen);
        r->found_len = res->ai_addrlen;
        r->fresh = 1;
    }
    r->running = 0;
    pthread_mutex_unlock(&r->mu);
    if (res) freeaddrinfo(res);
    unref(r);
    return NULL;
}

fb_resolver *fb_resolver_new(const char *host, uint16_t port)
{
    if (!host || strlen(host) >= sizeof ((fb_resolver *)0)->host) {
        errno = EINVAL;
        return NULL;
    }
    fb_resolver *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        errno = ENOMEM;
        return NULL;
    }
    r->refs = 1;
    strcpy(r->host, host);
    snprintf(r->port, sizeof r->port, "%u", (unsigned)port);
    return r;
}

int fb_resolver_start(fb_resolver *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->running) {
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    r->running = 1;
    r->refs++;
    pthread_mutex_unlock(&r->mu);
    pthread_attr_t a;
    pthread_t t;
    int rc = pthread_attr_init(&a);
    if (rc == 0) {
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&a, 256 * 1024);     /* getaddrinfo's needs, not the default 8 MiB */
        rc = pthread_create(&t, &a, lookup, r);
        pthread_attr_destroy(&a);
    }
    if (rc != 0) {
        pthread_mutex_lock(&r->mu);
        r->running = 0;
        r->refs--;
        pthread_mutex_unlock(&r->mu);
        errno = rc;
        return -1;
    }
    return 0;
}

int fb_resolver_take(fb_resolver *r, void *addr, size_t *len, size_t cap)
{
    int changed = 0;
    pthread_mutex_lock(&r->mu);
    if (r->fresh) {
        r->fresh = 0;
        if ((size_t)r->found_len <= cap && ((size_t)r->found_len != *len || memcmp(addr, &r->found, *len) != 0)) {
            memcpy(addr, &r->found, r->found_len);
            *len = r->found_len;
            r->st.changes++;
            changed = 1;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return changed;
}

void fb_resolver_get_stats(fb_resolver *r, fb_resolver_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    pthread_mutex_unlock(&r->mu);
}

void fb_resolver_free(fb_resolver *r)
{
    if (r) unref(r);
}
