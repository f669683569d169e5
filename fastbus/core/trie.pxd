# Trie's C state (fb_trie.h); declared for `from fastbus._core cimport Trie`.
from fastbus.includes.fb_lock cimport fb_lock
from fastbus.includes.fb_common cimport fb_span
from fastbus.includes.fb_trie cimport fb_trie


cdef class Trie:
    cdef fb_trie *_t
    cdef fb_lock _lock


cdef class _Spans:
    # A sequence of topics pinned as C spans (the objects stay referenced).
    cdef fb_span *spans
    cdef size_t n
    cdef object keep
