# Mirrors csrc/fb_view.h
from libc.stdint cimport uint64_t

from fastbus.includes.fb_lock cimport fb_lock
from fastbus.includes.fb_trie cimport fb_trie

cdef extern from "fb_view.h" nogil:
    enum:
        FB_VIEW_LEASE_USE_PERMILLE
        FB_VIEW_RENEW_NONE
        FB_VIEW_RENEW_WANTED
        FB_VIEW_RENEW_SENT

    ctypedef struct fb_view:
        fb_lock lock
        fb_trie *trie
        int on
        uint64_t applied
        uint64_t acked
        uint64_t ack_until_ns
        uint64_t wants
        uint64_t lease_until_ns
        uint64_t renew_at_ns
        int renew
        uint64_t leases

    void fb_view_init(fb_view *v)
    void fb_view_free(fb_view *v)
    int fb_view_apply(fb_view *v, unsigned flags, const void *ops, size_t len, int has_seq, uint64_t seq,
                      uint64_t now_ns, uint64_t *ack)
    void fb_view_acked(fb_view *v, uint64_t seq)
    uint64_t fb_view_grant(fb_view *v, uint64_t ack_until_ns)
    void fb_view_forget(fb_view *v)
    int fb_view_match(fb_view *v, const void *topic, size_t len)
    int fb_view_match_lease(fb_view *v, const void *topic, size_t len, uint64_t *until_ns)
    int fb_view_in_lease(fb_view *v, uint64_t now_ns)
    int fb_view_ask_renewal(fb_view *v, uint64_t now_ns, int force)
    int fb_view_take_renewal(fb_view *v)
    void fb_view_renewal_unsent(fb_view *v)
    uint64_t fb_view_lease(fb_view *v, uint64_t sent_ns, uint64_t lease_us)
    void fb_view_renewal_answered(fb_view *v)
    void fb_view_set_lease(fb_view *v, uint64_t until_ns)
