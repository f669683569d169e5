# Mirrors csrc/fb_zmtp_server.h
from libc.stdint cimport int64_t, uint64_t

from fastbus.includes.fb_reader cimport fb_zmq_msg

cdef extern from "fb_zmtp_server.h" nogil:
    enum: FB_ZMTP_SERVER_ID_LEN
    ctypedef struct fb_zmtp_server_options:
        int sndhwm
        int sndbuf
        int rcvbuf
        int keepalive_idle_s
        int keepalive_intvl_s
        int keepalive_cnt
        uint64_t max_msg_bytes
        int resp_auth_required

    ctypedef struct fb_zmtp_server_stats:
        uint64_t accepted
        uint64_t connections
        uint64_t disconnects
        uint64_t protocol_errors
        uint64_t dropped_messages
        uint64_t handshake_timeouts
        uint64_t resp_accepted
        uint64_t syscalls_send
        uint64_t syscalls_recv
        uint64_t syscalls_poll

    ctypedef struct fb_zmtp_server:
        pass

    fb_zmtp_server *fb_zmtp_server_new(const fb_zmtp_server_options *opts, int *err)
    int fb_zmtp_server_listen(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen)
    int fb_zmtp_server_listen_resp(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen)
    int fb_zmtp_server_close_peer(fb_zmtp_server *s, const unsigned char *id, size_t len, int any)
    void fb_zmtp_server_routed(fb_zmtp_server *s, uint64_t receivers, uint64_t over)
    void fb_zmtp_server_close(fb_zmtp_server *s, int linger_ms)
    void fb_zmtp_server_free(fb_zmtp_server *s)
    int fb_zmtp_server_send(void *s, const void *buf, size_t len, int flags)
    int fb_zmtp_server_getsockopt(void *s, int option, void *value, size_t *len)
    int fb_zmtp_server_msg_recv(fb_zmq_msg *msg, void *s, int flags)
    const char *fb_zmtp_server_msg_gets(const fb_zmq_msg *msg, const char *property)
    int fb_zmtp_server_expire(fb_zmtp_server *s, uint64_t handshake_ns)
    int fb_zmtp_server_buffered(const fb_zmtp_server *s)
    int64_t fb_zmtp_server_unsent(const fb_zmtp_server *s, const unsigned char *id, size_t len)
    int fb_zmtp_server_take_gone(fb_zmtp_server *s, unsigned char *id)
    void fb_zmtp_server_get_stats(const fb_zmtp_server *s, fb_zmtp_server_stats *out)
