# Mirrors csrc/fb_leases.h
from libc.stdint cimport uint8_t, uint64_t

from fastbus.includes.fb_links cimport fb_link
from fastbus.includes.fb_linkq cimport fb_zmq_msg_calls
from fastbus.includes.fb_zmq_api cimport fb_zmq_api

cdef extern from "fb_leases.h" nogil:
    enum:
        FB_INSTANCE_MAX
        FB_PONG_SENT
        FB_PONG_QUEUED
        FB_PONG_GONE
        FB_PONG_NOT

    ctypedef struct fb_leases:
        uint8_t instance[64]
        size_t instlen
        uint64_t lease_ns
        uint64_t answered
        uint64_t granted

    int fb_leases_set(fb_leases *l, const void *instance, size_t n, uint64_t lease_ns)
    int fb_leases_pong(fb_leases *l, fb_link *s, const fb_zmq_api *api, void *sock, const fb_zmq_msg_calls *z,
                       const void *token, size_t tlen, const void *ask, size_t asklen, uint64_t now)
    void fb_leases_grant(fb_link *s, uint64_t end_ns)
