# Redis's glob patterns (csrc/fb_glob.h).
# Part of fastbus/_core.pyx (included there).

def glob_match(pattern, channel) -> bool:
    """Does the glob ``pattern`` match ``channel`` (bytes, str or numbers,
    as publish() takes them), exactly as Redis's PSUBSCRIBE matches it?"""
    cdef bytes p = _as_message(pattern)
    cdef bytes c = _as_message(channel)
    return fb_glob_match(PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p), PyBytes_AS_STRING(c),
                         PyBytes_GET_SIZE(c)) == 1


def glob_prefix(pattern) -> tuple:
    """``(prefix, prefix_star)``: the literal bytes every channel the glob
    matches starts with, and whether the glob is exactly that prefix and
    ``*`` (then every channel with the prefix matches)."""
    cdef bytes p = _as_message(pattern)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(p)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n)
    cdef int star = 0
    cdef size_t k = fb_glob_prefix(PyBytes_AS_STRING(p), <size_t>n, PyBytes_AS_STRING(out), &star)
    return out[:k], star == 1
