# Mirrors csrc/fb_forwarder.h
from libc.stdint cimport uint64_t
from fastbus.includes.fb_common cimport fb_keylist
from fastbus.includes.fb_trie cimport fb_trie

cdef extern from "fb_forwarder.h" nogil:
    ctypedef enum fb_forwarder_mode:
        FB_FWD_DEDUP
        FB_FWD_SUBSUME

    ctypedef struct fb_forwarder:
        pass

    fb_forwarder *fb_forwarder_new(fb_forwarder_mode mode, size_t cap, size_t cap_low)
    fb_forwarder *fb_forwarder_new_over(fb_trie *t, fb_forwarder_mode mode, size_t cap, size_t cap_low)
    void fb_forwarder_free(fb_forwarder *f)
    int fb_forwarder_drop_peer(fb_forwarder *f, uint64_t peer)
    int fb_forwarder_subscribe(fb_forwarder *f, uint64_t peer, const void *key, size_t len, int kind,
                         fb_keylist *diff)
    int fb_forwarder_unsubscribe(fb_forwarder *f, uint64_t peer, const void *key, size_t len, int kind,
                           fb_keylist *diff)
    int fb_forwarder_remove_peer(fb_forwarder *f, uint64_t peer, fb_keylist *diff)
    int fb_forwarder_remove_peer_some(fb_forwarder *f, uint64_t peer, fb_keylist *diff, size_t max_bytes)
    int fb_forwarder_snapshot(const fb_forwarder *f, fb_keylist *out)
    size_t fb_forwarder_upstream_count(const fb_forwarder *f)
    int fb_forwarder_collapsed(const fb_forwarder *f)
    fb_forwarder_mode fb_forwarder_get_mode(const fb_forwarder *f)
    const fb_trie *fb_forwarder_trie(const fb_forwarder *f)
