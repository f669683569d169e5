# Mirrors csrc/fb_links.h
from libc.stdint cimport uint8_t, uint32_t, uint64_t

from fastbus.includes.fb_linkq cimport fb_linkq, fb_qentry, fb_zmq_msg_calls
from fastbus.includes.fb_ring cimport fb_ring

cdef extern from "fb_links.h" nogil:
    enum:
        FB_LINK_IDENT_MAX
        FB_LINK_NONE
        FB_LINKS_MAX
        FB_EVENT_WANT
        FB_EVENT_FLOW
        FB_EVENT_SLOW
        FB_EVENT_GONE
        FB_EVENT_OVERFLOW
        FB_EVENT_DETACHED
        FB_KEPT
        FB_KICK_SLOW
        FB_KICK_CONTROL

    ctypedef struct fb_link:
        uint8_t session
        uint8_t acks
        uint8_t gone
        uint8_t blocked
        uint8_t holding
        uint8_t exempt
        uint8_t asked
        uint8_t overflowed
        uint8_t resumable
        uint8_t detached
        uint8_t idlen
        uint8_t ident[255]
        uint8_t seq[8]
        uint64_t batches_in, messages_in, bytes_in, batches_out, messages_out, bytes_out
        uint64_t lease_end_ns
        uint64_t last_sent_ns
        fb_linkq q
        uint64_t taken
        fb_ring ring
        uint64_t received, received_told
        uint64_t received_bytes
        uint8_t jhas
        uint8_t jdirty
        uint8_t jsid[16]
        uint64_t jend
        uint64_t received_committed

    ctypedef struct fb_link_event:
        uint32_t kind
        uint32_t link
        uint32_t value

    ctypedef void (*fb_links_hold_fn)(void *arg, uint32_t link, int held) noexcept nogil

    ctypedef struct fb_links:
        fb_link *at
        uint32_t n
        uint32_t *index
        uint32_t icap, iused
        uint32_t *blocked
        uint32_t nblocked
        uint32_t *dirty
        uint32_t ndirty
        fb_link_event *events
        uint32_t nevents
        size_t max_queue
        size_t flow_bytes
        uint8_t disconnect
        uint8_t paused
        uint8_t flow_asked
        uint32_t nholding
        uint64_t dropped_slow
        fb_links_hold_fn hold
        void *hold_arg

    int fb_links_init(fb_links *t)
    void fb_links_free(fb_links *t, const fb_zmq_msg_calls *z)
    int fb_links_reserve(fb_links *t, uint32_t link)
    uint32_t fb_links_find(const fb_links *t, const uint8_t *ident, size_t n)
    int fb_links_name(fb_links *t, uint32_t link, const uint8_t *ident, size_t n)
    void fb_links_unname(fb_links *t, uint32_t link)
    int fb_links_block(fb_links *t, uint32_t link)
    int fb_links_unblock(fb_links *t, uint32_t link)
    void fb_links_detach(fb_links *t, uint32_t link)
    void fb_links_reset(fb_links *t, uint32_t link, const fb_zmq_msg_calls *z)
    void fb_links_lose(fb_links *t, uint32_t link, uint32_t kind, uint32_t value, const fb_zmq_msg_calls *z)
    void fb_links_mark_dirty(fb_links *t, uint32_t link)
    void fb_links_event(fb_links *t, uint32_t kind, uint32_t link, uint32_t value)
    int fb_links_has_event(const fb_links *t, uint32_t kind, uint32_t link)
    void fb_links_forget_events(fb_links *t, uint32_t link, uint32_t keep)
    uint64_t fb_links_replay(fb_links *t, uint32_t link, uint64_t taken, const fb_zmq_msg_calls *z, uint64_t *lost)
    void fb_links_ask_flow(fb_links *t)
    void fb_links_push(fb_links *t, uint32_t link, fb_qentry *e)
    int fb_links_release(fb_links *t, uint32_t link)
    void fb_links_exempt(fb_links *t, uint32_t link)
    void fb_links_drained(fb_links *t, uint32_t link)
    int fb_links_enforce(fb_links *t, uint32_t link, const fb_zmq_msg_calls *z)
