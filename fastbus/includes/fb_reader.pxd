# Mirrors csrc/fb_reader.h
from libc.stdint cimport uint64_t

from fastbus.includes.fb_react cimport fb_react
from fastbus.includes.fb_replies cimport fb_replies
from fastbus.includes.fb_slock cimport fb_slock

from fastbus.includes.fb_zmq_msg cimport fb_zmq_msg

cdef extern from "fb_reader.h" nogil:
    ctypedef struct fb_zmq_recv_calls:
        int (*msg_init)(fb_zmq_msg *msg) noexcept nogil
        int (*msg_recv)(fb_zmq_msg *msg, void *sock, int flags) noexcept nogil
        void *(*msg_data)(fb_zmq_msg *msg) noexcept nogil
        size_t (*msg_size)(const fb_zmq_msg *msg) noexcept nogil
        int (*msg_more)(const fb_zmq_msg *msg) noexcept nogil
        int (*msg_close)(fb_zmq_msg *msg) noexcept nogil
        int (*getsockopt)(void *sock, int option, void *value, size_t *len) noexcept nogil
        int (*send)(void *sock, const void *buf, size_t len, int flags) noexcept nogil
        int (*pending)(void *sock) noexcept nogil

    ctypedef struct fb_reader_item:
        pass

    ctypedef struct fb_reader:
        fb_zmq_recv_calls z
        void *sock
        int sock_fd
        fb_slock *slock
        size_t max_bytes
        const void *data_command
        size_t data_command_len
        int owner_fd
        int wake_on_data
        fb_react *react
        const void *lost_command
        size_t lost_command_len
        int (*lost)(void *sock)
        fb_replies *replies
        int want_wake
        int handed
        uint64_t read_messages
        int owner_in
        int owner_recent
        uint64_t owner_left_ns
        uint64_t parks
        uint64_t replies_taken
        size_t queued
        size_t queued_bytes
        int running


    int fb_reader_start(fb_reader *r)
    void fb_reader_wake(fb_reader *r)
    void fb_reader_owner_enter(fb_reader *r)
    void fb_reader_owner_leave(fb_reader *r)
    void fb_reader_stop(fb_reader *r)
    size_t fb_reader_pop(fb_reader *r, fb_reader_item **item, const unsigned char **frames, size_t *lens,
                         size_t max_frames)
    void fb_reader_release(fb_reader_item *item)
