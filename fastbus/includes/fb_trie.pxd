# Mirrors csrc/fb_trie.h
from libc.stdint cimport uint32_t, uint64_t
from fastbus.includes.fb_common cimport fb_span, fb_idvec, fb_keylist

cdef extern from "fb_trie.h" nogil:
    ctypedef struct fb_trie:
        pass

    ctypedef struct fb_trie_stats:
        size_t keys
        size_t subscriptions
        size_t subscribers
        size_t nodes
        size_t bytes_live
        size_t bytes_reserved

    fb_trie *fb_trie_new()
    void fb_trie_free(fb_trie *t)
    int fb_trie_add(fb_trie *t, const void *key, size_t len, int kind, uint64_t subscriber)
    int fb_trie_remove(fb_trie *t, const void *key, size_t len, int kind, uint64_t subscriber)
    int fb_trie_remove_subscriber(fb_trie *t, uint64_t subscriber, fb_keylist *gone)
    int fb_trie_match(fb_trie *t, const void *topic, size_t len, fb_idvec *out)
    int fb_trie_match_batch(fb_trie *t, const fb_span *topics, size_t n, size_t *offsets, fb_idvec *out)
    int fb_trie_any_match(const fb_trie *t, const void *topic, size_t len)
    int fb_trie_covered(const fb_trie *t, const void *key, size_t len, int kind)
    uint32_t fb_trie_refcount(const fb_trie *t, const void *key, size_t len, int kind, uint64_t subscriber)
    size_t fb_trie_holders(const fb_trie *t, const void *key, size_t len, int kind)

    enum:
        FB_WALK_NEXT
        FB_WALK_SKIP
        FB_WALK_STOP
    ctypedef int (*fb_walk_fn)(void *ctx, const unsigned char *key, size_t len,
                               uint32_t exact_holders, uint32_t prefix_holders) noexcept
    int fb_trie_walk(const fb_trie *t, const void *prefix, size_t plen, fb_walk_fn fn, void *ctx)

    int fb_trie_subscriber_keys(const fb_trie *t, uint64_t subscriber, fb_keylist *out)
    int fb_trie_subscriber_keys_some(const fb_trie *t, uint64_t subscriber, fb_keylist *out, size_t max_bytes)
    void fb_trie_get_stats(const fb_trie *t, fb_trie_stats *s)
    int fb_trie_check(const fb_trie *t, const char **why)
