/*
 * fb_common.h - status codes, key kinds and small shared helpers of the
 * fastbus core.
 *
 * The core is plain C11 with no dependency on Python, so a broker written in C
 * can embed it.  Every fallible function returns an int: >= 0 is a result,
 * < 0 is one of the FB_E* codes below.  Nothing in the core asserts on, or
 * crashes from, bad input: it returns a code and leaves its state unchanged
 * (documented exceptions: FB_ENOMEM in the middle of a multi-step operation
 * leaves a consistent, but possibly partially applied, state).
 */
#ifndef FB_COMMON_H
#define FB_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FB_VERSION_MAJOR 0
#define FB_VERSION_MINOR 1
#define FB_VERSION_PATCH 0

/* Status codes.  Keep fb_strerror() and fastbus/core/errors.pxi in step. */
enum {
    FB_OK = 0,
    FB_ENOMEM = -1,      /* allocation failed */
    FB_EINVAL = -2,      /* invalid argument (bad kind, NULL pointer, zero cap...) */
    FB_ENOTFOUND = -3,   /* removing a (key, kind, subscriber) that is not held */
    FB_ETOOBIG = -4,     /* key, record or table larger than the core supports */
    FB_EOVERFLOW = -5,   /* a reference count would overflow */
    FB_EMALFORMED = -6,  /* batch: structurally invalid (bad magic, length, varint, trailing bytes) */
    FB_ETRUNCATED = -7,  /* batch: ends before its declared content */
    FB_EVERSION = -8,    /* batch: unknown version or flag bits */
    FB_ELIMIT = -9,      /* batch: a field exceeds a decoder limit set by the caller */
    FB_ECHECKSUM = -10,  /* batch: checksum mismatch (or missing where required) */
    FB_EIO = -11,        /* a socket call failed (errno tells why) */
    FB_ECLOSED = -12,    /* the peer closed the connection */
    FB_ETIMEOUT = -13    /* nothing could be sent or received within the timeout */
};

/* The two kinds of subscription key. */
enum {
    FB_EXACT = 0,   /* matches a topic equal to the key */
    FB_PREFIX = 1   /* matches every topic that starts with the key ("" matches all) */
};

/* Upstream diff operations, numbered as ZeroMQ's subscription messages. */
enum {
    FB_OP_UNSUBSCRIBE = 0,
    FB_OP_SUBSCRIBE = 1
};

/* Largest key or topic the trie accepts (bytes).  Far above the 64 KiB that
 * the product promises; the limit exists so that lengths fit in 32 bits. */
#define FB_MAX_KEY ((size_t)0x7fffffff)

/* A byte string that the core reads but does not own. */
typedef struct fb_span {
    const unsigned char *ptr;
    size_t len;
} fb_span;

/* A human-readable message for a status code (static storage). */
const char *fb_strerror(int code);

/* Monotonic clock in nanoseconds (for outbox ages; callers may use their own). */
uint64_t fb_now_ns(void);

/* Release memory that the core handed over to the caller (fb_outbox_take). */
void fb_free(void *p);

/* ------------------------------------------------------------------------ */
/* Growable vector of subscriber ids: the output of fb_trie_match*.          */

typedef struct fb_idvec {
    uint64_t *ids;
    size_t n;
    size_t cap;
} fb_idvec;

void fb_idvec_init(fb_idvec *v);
void fb_idvec_free(fb_idvec *v);
static inline void fb_idvec_clear(fb_idvec *v) { v->n = 0; }
int fb_idvec_reserve(fb_idvec *v, size_t extra);

/* ------------------------------------------------------------------------ */
/* Key list: an ordered list of (op/kind flags, count, key bytes).            */
/* Output of fb_trie_remove_subscriber (keys whose last holder went), of the  */
/* forwarder (the upstream diff, in order) and of key enumerations.           */

#define FB_KL_PREFIX 0x1u      /* the key is a prefix key (else exact) */
#define FB_KL_SUBSCRIBE 0x2u   /* forwarder diff: subscribe (else unsubscribe) */

typedef struct fb_keyent {
    uint32_t flags;   /* FB_KL_* bits */
    uint32_t count;   /* holders, or reference count, depending on the producer */
    size_t off;       /* offset of the key bytes in fb_keylist.bytes */
    size_t len;       /* key length */
} fb_keyent;

typedef struct fb_keylist {
    fb_keyent *ents;
    size_t n, cap;
    unsigned char *bytes;
    size_t nbytes, capbytes;
} fb_keylist;

void fb_keylist_init(fb_keylist *l);
void fb_keylist_free(fb_keylist *l);
void fb_keylist_clear(fb_keylist *l);
int fb_keylist_push(fb_keylist *l, uint32_t flags, uint32_t count,
                    const void *key, size_t len);
/* Append all entries of src to dst. */
int fb_keylist_extend(fb_keylist *dst, const fb_keylist *src);
static inline const unsigned char *fb_keylist_key(const fb_keylist *l, size_t i) {
    return l->bytes + l->ents[i].off;
}

#ifdef __cplusplus
}
#endif
#endif /* FB_COMMON_H */
