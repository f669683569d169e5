# Router's C state (fb_router.h), the Trie it routes by and its decoder limits.
from fastbus.includes.fb_lock cimport fb_lock
from fastbus.includes.fb_batch cimport fb_decode_limits
from fastbus.includes.fb_router cimport fb_router


cdef class Router:
    cdef fb_router *_r
    cdef Trie _trie
    cdef fb_decode_limits _lim
    cdef fb_lock _lock
