# Mirrors csrc/fb_zmq_api.h
from fastbus.includes.fb_zmq_msg cimport fb_zmq_msg

cdef extern from "fb_zmq_api.h" nogil:
    ctypedef struct fb_zmq_pollitem:
        void *socket
        int fd
        short events
        short revents

    ctypedef void (*fb_zmq_free_fn)(void *data, void *hint) noexcept nogil
    ctypedef int (*fb_zmq_msg_init_fn)(fb_zmq_msg *msg) noexcept nogil
    ctypedef int (*fb_zmq_msg_init_size_fn)(fb_zmq_msg *msg, size_t size) noexcept nogil
    ctypedef int (*fb_zmq_msg_init_data_fn)(fb_zmq_msg *msg, void *data, size_t size, fb_zmq_free_fn ffn,
                                            void *hint) noexcept nogil
    ctypedef int (*fb_zmq_msg_close_fn)(fb_zmq_msg *msg) noexcept nogil
    ctypedef int (*fb_zmq_msg_recv_fn)(fb_zmq_msg *msg, void *s, int flags) noexcept nogil
    ctypedef int (*fb_zmq_msg_send_fn)(fb_zmq_msg *msg, void *s, int flags) noexcept nogil
    ctypedef void *(*fb_zmq_msg_data_fn)(fb_zmq_msg *msg) noexcept nogil
    ctypedef size_t (*fb_zmq_msg_size_fn)(const fb_zmq_msg *msg) noexcept nogil
    ctypedef int (*fb_zmq_msg_more_fn)(const fb_zmq_msg *msg) noexcept nogil
    ctypedef int (*fb_zmq_send_fn)(void *s, const void *buf, size_t len, int flags) noexcept nogil
    ctypedef int (*fb_zmq_errno_fn)() noexcept nogil
    ctypedef const char *(*fb_zmq_msg_gets_fn)(const fb_zmq_msg *msg, const char *prop) noexcept nogil
    ctypedef int (*fb_zmq_poll_fn)(fb_zmq_pollitem *items, int nitems, long timeout) noexcept nogil
    ctypedef int (*fb_zmq_getsockopt_fn)(void *s, int option, void *optval, size_t *optvallen) noexcept nogil

    ctypedef struct fb_zmq_api:
        fb_zmq_msg_init_fn msg_init
        fb_zmq_msg_init_size_fn msg_init_size
        fb_zmq_msg_init_data_fn msg_init_data
        fb_zmq_msg_close_fn msg_close
        fb_zmq_msg_recv_fn msg_recv
        fb_zmq_msg_send_fn msg_send
        fb_zmq_msg_data_fn msg_data
        fb_zmq_msg_size_fn msg_size
        fb_zmq_msg_more_fn msg_more
        fb_zmq_send_fn send
        fb_zmq_errno_fn last_error
        fb_zmq_msg_gets_fn msg_gets
        fb_zmq_poll_fn poll
        fb_zmq_getsockopt_fn getsockopt
