# Mirrors csrc/fb_router.h
from libc.stdint cimport uint32_t, uint64_t, int64_t
from fastbus.includes.fb_backlog cimport fb_backlog
from fastbus.includes.fb_batch cimport fb_decode_limits, fb_record
from fastbus.includes.fb_outbox cimport fb_outbox, fb_outbox_limits
from fastbus.includes.fb_trie cimport fb_trie

cdef extern from "fb_router.h" nogil:
    ctypedef struct fb_router:
        pass

    ctypedef struct fb_router_stats:
        uint64_t batches
        uint64_t records
        uint64_t bytes
        uint64_t deliveries
        uint64_t unrouted
        uint64_t rejected
        uint64_t oversize
        uint64_t no_responders
        uint64_t group_orphaned
        uint64_t held_kept
        uint64_t held_given
        uint64_t held_full
        uint64_t held_dropped

    fb_router *fb_router_new(const fb_outbox_limits *lim)
    void fb_router_free(fb_router *r)
    int fb_router_add_link(fb_router *r, uint32_t link)
    size_t fb_router_remove_link(fb_router *r, uint32_t link)
    int fb_router_has_link(const fb_router *r, uint32_t link)
    int fb_router_route(fb_router *r, fb_trie *t, const void *batch, size_t len,
                        const fb_decode_limits *lim, uint64_t source, uint64_t now_ns)
    size_t fb_router_full(fb_router *r, uint32_t *links, size_t cap)
    size_t fb_router_due(fb_router *r, uint64_t now_ns, uint32_t *links, size_t cap)
    size_t fb_router_pending(fb_router *r, uint32_t *links, size_t cap)
    uint64_t fb_router_deadline(const fb_router *r)
    int fb_router_take(fb_router *r, uint32_t link, uint64_t now_ns, unsigned char **buf, size_t *len)
    void fb_router_set_headers(fb_router *r, uint32_t link, int keep, int again)
    void fb_router_set_notify(fb_router *r, uint32_t link, int on)
    uint64_t FB_ROUTER_GROUP_BASE
    int fb_router_add_group(fb_router *r, const void *pattern, size_t len, uint64_t *id)
    int fb_router_remove_group(fb_router *r, uint64_t id)
    int fb_router_group_join(fb_router *r, uint64_t id, uint32_t link)
    int fb_router_group_leave(fb_router *r, uint64_t id, uint32_t link)
    size_t fb_router_group_size(const fb_router *r, uint64_t id)
    void fb_router_set_away(fb_router *r, uint32_t link, int away)
    int fb_router_group_hold(fb_router *r, uint64_t id)
    size_t fb_router_group_release(fb_router *r, uint64_t id)
    void fb_router_set_held_limit(fb_router *r, size_t max_bytes)
    size_t fb_router_group_held(const fb_router *r, uint64_t id)
    size_t fb_router_held_bytes(const fb_router *r)
    int64_t fb_router_group_give(fb_router *r, uint64_t id, uint64_t now_ns)
    size_t fb_router_group_expire(fb_router *r, uint64_t id, uint64_t before_ns)
    enum: FB_HELD_KEPT
    enum: FB_HELD_GONE
    ctypedef void (*fb_router_held_fn)(void *arg, const unsigned char *mark, size_t mark_len, int what,
                                       const fb_record *rec, uint64_t at_ns, size_t n) noexcept nogil
    void fb_router_set_held_hook(fb_router *r, fb_router_held_fn fn, void *arg)
    const fb_backlog *fb_router_group_backlog(const fb_router *r, uint64_t id)
    int fb_router_group_restore(fb_router *r, uint64_t id, const fb_record *rec, uint64_t at_ns)
    int fb_router_set_group_topic(fb_router *r, uint64_t id, const void *topic, size_t len, uint32_t capacity)
    enum: FB_ROUTER_MARK_MAX
    int fb_router_set_group_mark(fb_router *r, uint64_t id, const void *mark, size_t len)
    int64_t fb_router_route_groups(fb_router *r, fb_trie *t, const void *batch, size_t len, size_t skip,
                                   const uint64_t *ids, size_t nids, uint64_t source, uint64_t now_ns)
    void fb_router_set_broker(fb_router *r, uint32_t link, int broker)
    void fb_router_hold(fb_router *r, uint32_t link, int held)
    int fb_router_held(const fb_router *r, uint32_t link)
    uint64_t FB_ROUTER_GLOB_BASE
    int fb_router_add_glob(fb_router *r, uint32_t link, const void *pattern, size_t len, uint64_t *id)
    int fb_router_remove_glob(fb_router *r, uint64_t id)
    size_t fb_router_glob_count(const fb_router *r)
    void fb_router_set_catchall(fb_router *r, uint32_t link, uint64_t from_ns)
    fb_outbox *fb_router_outbox(fb_router *r, uint32_t link)
    void fb_router_touch(fb_router *r, uint32_t link)
    void fb_router_get_stats(const fb_router *r, fb_router_stats *s)
