# A downstream extension, as another broker written in Cython would be:
# it cimports fastbus's extension types and calls the C core directly.
from libc.stdint cimport uint64_t
from fastbus._core cimport Trie, Outbox, _check
from fastbus._publisher cimport Publisher
from fastbus.includes.fb_common cimport fb_idvec, fb_idvec_init, fb_idvec_free, FB_EXACT, FB_PREFIX
from fastbus.includes.fb_trie cimport fb_trie_add, fb_trie_match
from fastbus.includes.fb_outbox cimport fb_outbox_append, fb_outbox_count


def route(Trie t, bytes topic):
    """Subscribe through the C API, then match with the GIL released."""
    cdef fb_idvec v
    cdef list out
    cdef const char *p = topic
    cdef size_t n = len(topic)
    fb_idvec_init(&v)
    # Hold the object's lock when sharing it across threads; this test does not.
    with nogil:
        fb_trie_add(t._t, b"news.", 5, FB_PREFIX, 42)
        fb_trie_match(t._t, p, n, &v)
    out = [v.ids[i] for i in range(v.n)]
    fb_idvec_free(&v)
    return sorted(out)


def fill(Outbox box, int count):
    """Append records to an Outbox through the C API."""
    cdef int i
    for i in range(count):
        fb_outbox_append(&box._o, b"t", 1, b"payload", 7, 0)
    return fb_outbox_count(&box._o)


def sealed_or_queued(Publisher p):
    """A Publisher's state read from C (the type another extension cimports,
    as fastbus's own client engine does): records in its outbox."""
    return fb_outbox_count(&p.outbox._o)


def check(int rc):
    """A core status code through _core's one place for errors."""
    return _check(rc, "downstream")
