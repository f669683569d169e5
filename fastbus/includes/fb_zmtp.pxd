# Mirrors csrc/fb_zmtp.h
from libc.stdint cimport uint64_t

from fastbus.includes.fb_reader cimport fb_zmq_msg

cdef extern from "fb_zmtp.h" nogil:
    enum:
        FB_ZMTP_DONTWAIT
        FB_ZMTP_SNDMORE
        FB_ZMTP_RCVMORE
        FB_ZMTP_FD
        FB_ZMTP_EVENTS
        FB_ZMTP_POLLIN
        FB_ZMTP_POLLOUT
        FB_ZMTP_RESUMED
        FB_ZMTP_FRESH
        FB_ZMTP_FRESH_DROP

    ctypedef struct fb_zmtp_options:
        int sndhwm
        int sndbuf
        int rcvbuf
        int keepalive
        uint64_t max_msg_bytes
        uint64_t reconnect_ivl_ns
        uint64_t reconnect_ivl_max_ns

    ctypedef struct fb_zmtp_stats:
        uint64_t connects
        uint64_t disconnects
        uint64_t protocol_errors
        uint64_t dropped_messages
        uint64_t syscalls_send
        uint64_t syscalls_recv
        uint64_t unkept
        uint64_t lookups
        uint64_t lookup_failures
        uint64_t address_changes

    ctypedef struct fb_zmtp:
        pass

    fb_zmtp *fb_zmtp_open(const void *addr, size_t addrlen, const fb_zmtp_options *opts, int *err)
    int fb_zmtp_set_host(fb_zmtp *z, const char *host)
    int fb_zmtp_address(const fb_zmtp *z, void *addr, size_t *len)
    void fb_zmtp_close(fb_zmtp *z, int linger_ms)
    int fb_zmtp_send(void *z, const void *buf, size_t len, int flags)
    int fb_zmtp_getsockopt(void *z, int option, void *value, size_t *len)
    int fb_zmtp_msg_init(fb_zmq_msg *msg)
    int fb_zmtp_msg_recv(fb_zmq_msg *msg, void *z, int flags)
    void *fb_zmtp_msg_data(fb_zmq_msg *msg)
    size_t fb_zmtp_msg_size(const fb_zmq_msg *msg)
    int fb_zmtp_msg_more(const fb_zmq_msg *msg)
    int fb_zmtp_msg_close(fb_zmq_msg *msg)
    int fb_zmtp_buffered(fb_zmtp *z)
    int fb_zmtp_pending(fb_zmtp *z)
    int fb_zmtp_set_reconnect_message(fb_zmtp *z, const void *const *frames, const size_t *lens, int n)
    int fb_zmtp_set_resend(fb_zmtp *z, const unsigned char *commands, size_t n, size_t max_bytes)
    void fb_zmtp_acked(fb_zmtp *z, uint64_t n)
    uint64_t fb_zmtp_resume(fb_zmtp *z, uint64_t received, int how)
    void fb_zmtp_resend_state(const fb_zmtp *z, uint64_t *counted, uint64_t *acked, size_t *kept_bytes, int *held)
    int fb_zmtp_take_lost(void *sock)
    ctypedef int (*fb_zmtp_kept_fn)(void *arg, const unsigned char *first, size_t first_len,
                                    const unsigned char *last, size_t last_len) noexcept nogil
    size_t fb_zmtp_kept_each(const fb_zmtp *z, fb_zmtp_kept_fn fn, void *arg)
    int fb_zmtp_connected(const fb_zmtp *z)
    void fb_zmtp_get_stats(const fb_zmtp *z, fb_zmtp_stats *out)
