# Mirrors csrc/fb_react.h
from libc.stdint cimport uint64_t

from fastbus.includes.fb_view cimport fb_view
from fastbus.includes.fb_wake cimport fb_wake

cdef extern from "fb_react.h" nogil:
    enum: FB_REACT_INSTANCE_MAX
    enum: FB_REACT_TOKEN_MAX
    enum: FB_REACT_FRAMES_MAX
    enum:
        FB_REACT_OWNER
        FB_REACT_TAKEN
        FB_REACT_ACK

    ctypedef struct fb_react:
        int (*send)(void *sock, const void *buf, size_t len, int flags) noexcept nogil
        void *sock
        const void *flow_command
        size_t flow_command_len
        unsigned char flow_pause
        int *flow_paused
        fb_wake *flow_wake
        const void *flow_reset_command
        size_t flow_reset_command_len
        const void *want_command
        size_t want_command_len
        const void *ack_command
        size_t ack_command_len
        fb_view *view
        const void *pong_command
        size_t pong_command_len
        const void *lease_token
        size_t lease_token_len
        const void *lease_ask
        size_t lease_ask_len
        const void *ping_command
        size_t ping_command_len
        const void *live_pong_command
        size_t live_pong_command_len
        uint64_t ping_interval_ns
        const void *took_command
        size_t took_command_len
        void (*took)(void *sock, uint64_t n) noexcept nogil
        uint64_t next_ping_ns
        uint64_t pings_sent
        uint64_t pongs_taken
        uint64_t flow_pauses
        uint64_t wants_refused
        uint64_t lease_pings
        size_t instance_len

    int fb_react_message(fb_react *x, size_t nframes, const unsigned char *const *frames, const size_t *lens,
                         uint64_t *ack)
    void fb_react_set_instance(fb_react *x, const void *instance, size_t len)
    int fb_react_ping_if_due(fb_react *x, uint64_t now)
    int fb_react_lease_ping(fb_react *x, uint64_t now, unsigned char *token)
    int fb_react_ping_wait_ms(fb_react *x, uint64_t now)
