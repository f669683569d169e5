# Forwarder's C state (fb_forwarder.h).
from fastbus.includes.fb_lock cimport fb_lock
from fastbus.includes.fb_forwarder cimport fb_forwarder


cdef class Forwarder:
    cdef fb_forwarder *_f
    cdef fb_lock _lock
    cdef fb_lock *_lk         # &_lock, or the lock of the Trie it works over
    cdef object _table        # that Trie (kept alive while the forwarder uses it)
