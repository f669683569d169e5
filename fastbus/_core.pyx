# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Python bindings of the fastbus C core (csrc/): Trie, Forwarder, Outbox,
Batch, Router, RespPump, glob matching.  What knows a Python-level shape
is built on them in extensions of its own (fastbus._publisher,
fastbus._decoders, fastbus.queue._layout: docs/CORE.md).

Thin by design: each method converts arguments, takes the object's lock,
calls C, and converts the result.  The GIL is released around C work whose
cost grows with its input (batch matches, subscriber removal, decoding);
single-key operations take well under a microsecond and keep it.  C status
codes become exceptions in one place, fastbus/core/errors.pxi.

One extension, its code by concern in fastbus/core/*.pxi (included below),
its extension types declared in fastbus/core/*.pxd (included by _core.pxd).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBuffer_FillInfo, PyBUF_SIMPLE
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM

from cpython.object cimport PyObject

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)
from fastbus.includes.fb_lock cimport fb_lock, fb_lock_try, fb_lock_release, fb_lock_wait
from cpython cimport array
from libc.stdint cimport uint8_t, int32_t, uint32_t, uint64_t, int64_t, UINT64_MAX, UINT32_MAX
from libc.string cimport memcpy, memcmp, memset
from libc.stdlib cimport malloc, free
from libc.errno cimport errno

from fastbus.includes.fb_common cimport *
from fastbus.includes.fb_trie cimport *
from fastbus.includes.fb_forwarder cimport *
from fastbus.includes.fb_batch cimport *
from fastbus.includes.fb_outbox cimport *
from fastbus.includes.fb_router cimport *
from fastbus.includes.fb_resp cimport *
from fastbus.includes.fb_view cimport *
from fastbus.includes.fb_glob cimport *
from fastbus.includes.fb_replies cimport *
from fastbus.includes.fb_protocol cimport *

import array as _pyarray
import os

from fastbus.errors import BatchError, FastbusError, ForwarderError, NotSubscribedError

EXACT = FB_EXACT
PREFIX = FB_PREFIX
SUBSCRIBE = FB_OP_SUBSCRIBE
UNSUBSCRIBE = FB_OP_UNSUBSCRIBE
BATCH_VERSION = FB_BATCH_VERSION
#: The batch header's flag (byte 3) of a batch whose records carry headers.
BATCH_F_HEADERS = FB_BATCH_F_HEADERS
#: ... and the flag of one whose records may repeat the block before (docs/BATCH_FORMAT.md).
BATCH_F_HEADERS_AGAIN = FB_BATCH_F_HEADERS_AGAIN
CORE_VERSION = (FB_VERSION_MAJOR, FB_VERSION_MINOR, FB_VERSION_PATCH)
#: csrc/fb_protocol.h's values as this extension was built with them, by
#: fastbus/protocol.py's names (tests/test_protocol_header.py holds the
#: two to each other): each command as (its byte, its one-byte string),
#: FLOW's bytes likewise, the flags as ints.
WIRE_HEADER = {
    "HELLO": (bytes([FB_CMD_HELLO]), FB_CMD_HELLO_S[:1]),
    "SUB": (bytes([FB_CMD_SUB]), FB_CMD_SUB_S[:1]),
    "PUB": (bytes([FB_CMD_PUB]), FB_CMD_PUB_S[:1]),
    "PING": (bytes([FB_CMD_PING]), FB_CMD_PING_S[:1]),
    "STATS": (bytes([FB_CMD_STATS]), FB_CMD_STATS_S[:1]),
    "BYE": (bytes([FB_CMD_BYE]), FB_CMD_BYE_S[:1]),
    "ACK": (bytes([FB_CMD_ACK]), FB_CMD_ACK_S[:1]),
    "TAKEN": (bytes([FB_CMD_TAKEN]), FB_CMD_TAKEN_S[:1]),
    "RESP_REQUEST": (bytes([FB_CMD_RESP_REQUEST]), FB_CMD_RESP_REQUEST_S[:1]),
    "WELCOME": (bytes([FB_CMD_WELCOME]), FB_CMD_WELCOME_S[:1]),
    "CONFIRM": (bytes([FB_CMD_CONFIRM]), FB_CMD_CONFIRM_S[:1]),
    "DATA": (bytes([FB_CMD_DATA]), FB_CMD_DATA_S[:1]),
    "WANT": (bytes([FB_CMD_WANT]), FB_CMD_WANT_S[:1]),
    "GAP": (bytes([FB_CMD_GAP]), FB_CMD_GAP_S[:1]),
    "TOOK": (bytes([FB_CMD_TOOK]), FB_CMD_TOOK_S[:1]),
    "PONG": (bytes([FB_CMD_PONG]), FB_CMD_PONG_S[:1]),
    "STATS_REPLY": (bytes([FB_CMD_STATS_REPLY]), FB_CMD_STATS_REPLY_S[:1]),
    "KICK": (bytes([FB_CMD_KICK]), FB_CMD_KICK_S[:1]),
    "FLOW": (bytes([FB_CMD_FLOW]), FB_CMD_FLOW_S[:1]),
    "REFUSED": (bytes([FB_CMD_REFUSED]), FB_CMD_REFUSED_S[:1]),
    "NOTICE": (bytes([FB_CMD_NOTICE]), FB_CMD_NOTICE_S[:1]),
    "FLOW_PAUSE": (bytes([FB_FLOW_PAUSE]), FB_FLOW_PAUSE_S[:1]),
    "FLOW_RESUME": (bytes([FB_FLOW_RESUME]), FB_FLOW_RESUME_S[:1]),
    "WANT_RESET": FB_WANT_RESET,
    "LEASE_ASK": FB_LEASE_ASK_S[:FB_LEASE_ASK_LEN],
    "OP_SUBSCRIBE": FB_OP_F_SUBSCRIBE,
    "OP_PREFIX": FB_OP_F_PREFIX,
    "OP_GLOB": FB_OP_F_GLOB,
    "OP_QUEUE": FB_OP_F_QUEUE,
    "OP_HOLD": FB_OP_F_HOLD,
    "OP_BIND": FB_OP_F_BIND,
}
#: The share of a granted filter lease a peer counts on (csrc/fb_view.h).
LEASE_USE = FB_VIEW_LEASE_USE_PERMILLE / 1000.0

# Release the GIL for batches at least this large; below it, the release and
# re-acquire cost more than the work.
cdef enum:
    NOGIL_MIN_TOPICS = 64
    NOGIL_MIN_BYTES = 65536

include "core/errors.pxi"
include "core/common.pxi"
include "core/trie.pxi"
include "core/forwarder.pxi"
include "core/topic_cache.pxi"
include "core/batch.pxi"
include "core/headers.pxi"
include "core/outbox.pxi"
include "core/resp.pxi"
include "core/router.pxi"
include "core/replies.pxi"
include "core/glob.pxi"
