# Router's C state (fb_router.h), the Trie it routes by and its decoder limits.
from fastbus.includes.fb_lock cimport fb_lock
from fastbus.includes.fb_batch cimport fb_decode_limits
from libc.stdint cimport uint32_t, uint64_t
from fastbus.includes.fb_backlog cimport fb_backlog
from fastbus.includes.fb_router cimport fb_router, fb_router_held_fn


# What the data plane's hold hook is given (Router.dp_hold_hook).
cdef struct _router_hold:
    fb_router *r
    fb_lock *lock

ctypedef void (*_hold_fn)(void *arg, uint32_t link, int held) noexcept nogil


cdef class Router:
    cdef fb_router *_r
    cdef _router_hold _hold
    cdef Trie _trie
    cdef fb_decode_limits _lim
    cdef fb_lock _lock

    # The data plane's calls (fastbus/broker/_relay.pyx), made without the
    # GIL: each takes the locks it needs (the router's, and the trie's to
    # route), so the relay never reaches for another extension's fields.
    # route: fb_router_route of a batch from ``link`` and the links it
    # filled (fb_router_full, up to ``cap``), the status; ``oversize`` and
    # ``deliveries``: what this batch added to those counters.
    cdef int dp_route(self, uint32_t link, const void *data, size_t len, uint64_t now, uint32_t *full,
                      size_t cap, size_t *nfull, uint64_t *oversize, uint64_t *deliveries) noexcept nogil
    cdef size_t dp_pending(self, uint32_t *links, size_t cap) noexcept nogil
    cdef size_t dp_due(self, uint64_t now, uint32_t *links, size_t cap) noexcept nogil
    cdef int dp_take(self, uint32_t link, uint64_t now, unsigned char **buf, size_t *len) noexcept nogil
    cdef uint64_t dp_deadline(self) noexcept nogil
    cdef void dp_hold(self, uint32_t link, int held) noexcept nogil
    # dp_hold as a C function and its argument, for C that holds links
    # itself (csrc/fb_links.h's hold hook); valid while the Router lives.
    cdef void dp_hold_hook(self, _hold_fn *fn, void **arg) noexcept nogil
    cdef void dp_set_held_hook(self, fb_router_held_fn fn, void *arg) noexcept nogil
    # A held group's backlog, the router's lock held until dp_unlock
    # (the caller reads it meanwhile, without the GIL).
    cdef const fb_backlog *dp_lock_backlog(self, uint64_t gid) noexcept nogil
    cdef void dp_unlock(self) noexcept nogil
