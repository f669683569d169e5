# Mirrors csrc/fb_protocol.h: the wire protocol's command bytes and flag bits.

cdef extern from "fb_protocol.h" nogil:
    enum:
        FB_CMD_HELLO
        FB_CMD_SUB
        FB_CMD_PUB
        FB_CMD_PING
        FB_CMD_STATS
        FB_CMD_BYE
        FB_CMD_ACK
        FB_CMD_TAKEN
        FB_CMD_RESP_REQUEST
        FB_CMD_WELCOME
        FB_CMD_CONFIRM
        FB_CMD_DATA
        FB_CMD_WANT
        FB_CMD_GAP
        FB_CMD_TOOK
        FB_CMD_PONG
        FB_CMD_STATS_REPLY
        FB_CMD_KICK
        FB_CMD_FLOW
        FB_CMD_REFUSED
        FB_CMD_NOTICE
        FB_FLOW_PAUSE
        FB_FLOW_RESUME
        FB_WANT_RESET
        FB_LEASE_ASK_LEN
        FB_OP_F_SUBSCRIBE
        FB_OP_F_PREFIX
        FB_OP_F_GLOB
        FB_OP_F_QUEUE
        FB_OP_F_HOLD
        FB_OP_F_BIND

    const char *FB_CMD_HELLO_S
    const char *FB_CMD_SUB_S
    const char *FB_CMD_PUB_S
    const char *FB_CMD_PING_S
    const char *FB_CMD_STATS_S
    const char *FB_CMD_BYE_S
    const char *FB_CMD_ACK_S
    const char *FB_CMD_TAKEN_S
    const char *FB_CMD_RESP_REQUEST_S
    const char *FB_CMD_WELCOME_S
    const char *FB_CMD_CONFIRM_S
    const char *FB_CMD_DATA_S
    const char *FB_CMD_WANT_S
    const char *FB_CMD_GAP_S
    const char *FB_CMD_TOOK_S
    const char *FB_CMD_PONG_S
    const char *FB_CMD_STATS_REPLY_S
    const char *FB_CMD_KICK_S
    const char *FB_CMD_FLOW_S
    const char *FB_CMD_REFUSED_S
    const char *FB_CMD_NOTICE_S
    const char *FB_FLOW_PAUSE_S
    const char *FB_FLOW_RESUME_S
    const char *FB_LEASE_ASK_S
