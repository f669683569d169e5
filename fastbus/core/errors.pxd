# The one place where C status codes become exceptions (errors.pxi), as other
# extensions cimport it: ``from fastbus._core cimport _check, _raise``.

cdef object _error(int rc, str what=*, int err=*)
cdef int _raise(int rc, str what=*, int err=*) except -1


cdef inline int _check(int rc, str what="") except -1:
    """rc if it is not an error code, else raise its exception."""
    if rc < 0:
        _raise(rc, what)
    return rc
