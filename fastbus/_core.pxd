# Extension types of fastbus._core, for other Cython extensions:
#
#   from fastbus._core cimport Trie
#   from fastbus.includes.fb_trie cimport fb_trie_match
#   cdef Trie t = Trie()
#   with nogil: fb_trie_match(t._t, ...)      # hold t's lock if threads share t
#
# Each object owns its C struct (_t / _f / _o) and a lock (fb_lock.h) that
# every method takes; code that calls the C API directly on an object other
# threads also use takes it too (fb_lock_wait / fb_lock_release on &obj._lock,
# without holding the GIL while waiting).
# (The broker's data plane uses Router's dp_ calls instead, which take the
# locks they need: fastbus/core/router.pxd.)
#
# The declarations live by concern in fastbus/core/*.pxd, next to the .pxi
# that implements them (included by fastbus/_core.pyx).
include "core/common.pxd"
include "core/errors.pxd"
include "core/trie.pxd"
include "core/forwarder.pxd"
include "core/batch.pxd"
include "core/headers.pxd"
include "core/outbox.pxd"
include "core/router.pxd"
include "core/replies.pxd"
include "core/resp.pxd"
