# Mirrors csrc/fb_sender.h
from libc.stdint cimport uint64_t

from fastbus.includes.fb_batchq cimport fb_batchq
from fastbus.includes.fb_burst cimport fb_burst
from fastbus.includes.fb_lock cimport fb_lock
from fastbus.includes.fb_outbox cimport fb_outbox
from fastbus.includes.fb_react cimport fb_react
from fastbus.includes.fb_reader cimport fb_reader
from fastbus.includes.fb_slock cimport fb_slock
from fastbus.includes.fb_wake cimport fb_wake

cdef extern from "fb_sender.h" nogil:
    ctypedef struct fb_zmq_calls:
        int (*send)(void *sock, const void *buf, size_t len, int flags) noexcept nogil
        int (*getsockopt)(void *sock, int option, void *value, size_t *len) noexcept nogil
        int (*pending)(void *sock) noexcept nogil

    ctypedef struct fb_sender:
        fb_zmq_calls z
        void *sock
        fb_slock *slock
        fb_outbox *outbox
        fb_lock *outbox_lock
        fb_batchq *sealed
        fb_burst *burst
        uint64_t linger_ns
        const void *command
        size_t command_len
        int owner_fd
        fb_reader *reader
        fb_react *react
        int paused
        int owner_first
        int handed
        int owner_skipped
        uint64_t full_waits
        uint64_t sent_messages
        uint64_t sent_batches
        uint64_t inline_messages
        uint64_t inline_batches
        int running
        fb_wake wake

    int fb_sender_start(fb_sender *s)
    void fb_sender_wake(fb_sender *s)
    int fb_sender_send_now(fb_sender *s, int full)
    void fb_sender_stop(fb_sender *s)
