/*
 * fb_trie.h - subscription trie: which subscribers want a topic.
 *
 * A path-compressed radix trie over arbitrary bytes (NUL and 0xff are plain
 * bytes; lengths are explicit).  A key is either EXACT (matches the topic equal
 * to it) or PREFIX (matches every topic starting with it; the empty prefix
 * matches everything).  Each (key, kind) is held by subscribers, identified by
 * caller-chosen 64-bit ids, with a reference count per (key, kind, subscriber):
 * subscribing twice needs two removes.
 *
 * Costs (L = key or topic length, K = keys the subscriber holds):
 *   add / remove          O(L + min(holders of the key, K))
 *   remove_subscriber     O(sum of its keys' lengths), never a whole-table walk
 *   match                 O(L + number of matching holders)
 * No function recurses on input: a 1 MB key is as safe as a short one.
 *
 * Memory: nodes live in a 32-bit-ref arena (fb_arena.h); a key held by one
 * subscriber costs its node (12 B header + 12 B holder + label bytes), a
 * 5-byte slot in its parent and an 8-byte entry in its subscriber's index.
 *
 * Not thread-safe, and fb_trie_match() writes (a per-subscriber mark): callers
 * serialise all calls on one trie.
 */
#ifndef FB_TRIE_H
#define FB_TRIE_H

#include "fb_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_trie fb_trie;

typedef struct fb_trie_stats {
    size_t keys;          /* distinct (key, kind) pairs with at least one holder */
    size_t subscriptions; /* (key, kind, subscriber) triples held */
    size_t subscribers;   /* subscribers holding at least one key */
    size_t nodes;         /* trie nodes, root included */
    size_t bytes_live;    /* bytes in live allocations (nodes, holder arrays, indexes, tables) */
    size_t bytes_reserved;/* bytes obtained from malloc, free lists and slack included */
} fb_trie_stats;

fb_trie *fb_trie_new(void);
void fb_trie_free(fb_trie *t);

/* Add one reference of `subscriber` to (key, kind).
 * Returns 1 if the (key, kind) just got its first holder, 0 if it already had
 * one, < 0 on error (FB_EINVAL bad kind, FB_ETOOBIG key > FB_MAX_KEY,
 * FB_EOVERFLOW count at UINT32_MAX, FB_ENOMEM; the trie is then unchanged). */
int fb_trie_add(fb_trie *t, const void *key, size_t len, int kind, uint64_t subscriber);

/* Drop one reference.  Returns 1 if the (key, kind) lost its last holder,
 * 0 if it still has holders, FB_ENOTFOUND if the subscriber does not hold it. */
int fb_trie_remove(fb_trie *t, const void *key, size_t len, int kind, uint64_t subscriber);

/* Drop every key the subscriber holds, whatever the counts.  If `gone` is not
 * NULL, the (key, kind) pairs that lost their last holder are appended to it
 * (flags FB_KL_PREFIX for prefix keys, count 0).  Returns the number of
 * (key, kind) pairs the subscriber held (0 for an unknown subscriber). */
int fb_trie_remove_subscriber(fb_trie *t, uint64_t subscriber, fb_keylist *gone);

/* Append to `out` every subscriber with a key matching `topic`, each once,
 * in no particular order.  Returns how many were appended, or FB_ENOMEM. */
int fb_trie_match(fb_trie *t, const void *topic, size_t len, fb_idvec *out);

/* Route many topics in one call.  offsets must have room for n + 1 entries:
 * the subscribers of topics[i] are out->ids[offsets[i] .. offsets[i+1]).
 * (out is appended to; offsets are absolute positions in out->ids.) */
int fb_trie_match_batch(fb_trie *t, const fb_span *topics, size_t n,
                        size_t *offsets, fb_idvec *out);

/* 1 if any held key matches the topic (a publisher's "does anybody want
 * this?"), else 0.  Read-only. */
int fb_trie_any_match(const fb_trie *t, const void *topic, size_t len);

/* 1 if a held PREFIX key other than (key, kind) itself covers (key, kind):
 * for an exact key, a prefix key p with key starting with p; for a prefix
 * key, such a p strictly shorter than key.  Read-only. */
int fb_trie_covered(const fb_trie *t, const void *key, size_t len, int kind);

/* Reference count of (key, kind) held by subscriber; 0 if not held. */
uint32_t fb_trie_refcount(const fb_trie *t, const void *key, size_t len, int kind,
                          uint64_t subscriber);

/* Number of subscribers holding (key, kind). */
size_t fb_trie_holders(const fb_trie *t, const void *key, size_t len, int kind);

/* Walk, in byte order, every key that starts with `prefix` (plen may be 0)
 * and has a holder of either kind.  The callback gets the key and the number
 * of exact and prefix holders at it, and returns one of FB_WALK_*.  The trie
 * must not be modified during the walk.  Returns FB_OK, FB_ENOMEM, or the
 * callback's negative return value (which stops the walk). */
enum { FB_WALK_NEXT = 0, FB_WALK_SKIP = 1, FB_WALK_STOP = 2 };
typedef int (*fb_walk_fn)(void *ctx, const unsigned char *key, size_t len,
                          uint32_t exact_holders, uint32_t prefix_holders);
int fb_trie_walk(const fb_trie *t, const void *prefix, size_t plen,
                 fb_walk_fn fn, void *ctx);

/* Append the keys held by subscriber (count = its reference count). */
int fb_trie_subscriber_keys(const fb_trie *t, uint64_t subscriber, fb_keylist *out);
/* The same, some of them: stops once it appended max_bytes of keys or more
 * (at least one key; 0: no limit), in no particular order. */
int fb_trie_subscriber_keys_some(const fb_trie *t, uint64_t subscriber, fb_keylist *out, size_t max_bytes);

void fb_trie_get_stats(const fb_trie *t, fb_trie_stats *s);

/* Verify every structural invariant (for tests and debugging).  Returns FB_OK
 * or FB_EINVAL, with a static description in *why when not NULL. */
int fb_trie_check(const fb_trie *t, const char **why);

#ifdef __cplusplus
}
#endif
#endif /* FB_TRIE_H */
