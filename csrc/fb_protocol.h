/*
 * fb_protocol.h - the wire protocol's command bytes and flag bits, for the
 * C code and the Cython code that write or read them (docs/PROTOCOL.md is
 * the normative description; fastbus/protocol.py names the same values
 * for Python).
 *
 * Why a header: the broker's data plane, its RESP sessions and the
 * client's engine all write and read these bytes, and a value spelled in
 * each place can drift from the others without any test noticing.  Here
 * each is written once; tests/test_protocol_header.py checks every value
 * against fastbus/protocol.py through the compiled extension (what was
 * built, not this file's text), and that the broker's sources spell no
 * command as a literal.
 *
 * Every message is a ZeroMQ multipart message whose first frame is one
 * command byte: FB_CMD_x is that byte, FB_CMD_x_S the same as a one-byte
 * string, for the calls that take a frame's bytes.
 */
#ifndef FB_PROTOCOL_H
#define FB_PROTOCOL_H

/* client -> broker (and a downstream broker -> its upstream) */
#define FB_CMD_HELLO        'H'    /* [H, json hello] */
#define FB_CMD_HELLO_S      "H"
#define FB_CMD_SUB          'S'    /* [S, seq u64, ops batch] */
#define FB_CMD_SUB_S        "S"
#define FB_CMD_PUB          'P'    /* [P, message batch] */
#define FB_CMD_PUB_S        "P"
#define FB_CMD_PING         'p'    /* [p, token(, lease ask)] */
#define FB_CMD_PING_S       "p"
#define FB_CMD_STATS        'Q'    /* [Q] */
#define FB_CMD_STATS_S      "Q"
#define FB_CMD_BYE          'B'    /* [B], both ways */
#define FB_CMD_BYE_S        "B"
#define FB_CMD_ACK          'A'    /* [A, want seq u64] */
#define FB_CMD_ACK_S        "A"
#define FB_CMD_TAKEN        'T'    /* [T, taken u64] */
#define FB_CMD_TAKEN_S      "T"
/* Never on the wire: a Redis client's request handed from a RESP
 * connection's C side (fb_resp_session.h) to the broker's Python, and its
 * answer back. */
#define FB_CMD_RESP_REQUEST   'r'
#define FB_CMD_RESP_REQUEST_S "r"

/* broker -> client (and an upstream broker -> a downstream one) */
#define FB_CMD_WELCOME      'h'    /* [h, json] */
#define FB_CMD_WELCOME_S    "h"
#define FB_CMD_CONFIRM      'c'    /* [c, seq u64] */
#define FB_CMD_CONFIRM_S    "c"
#define FB_CMD_DATA         'D'    /* [D, acked seq u64, message batch] */
#define FB_CMD_DATA_S       "D"
#define FB_CMD_WANT         'W'    /* [W, flags u8, ops batch(, seq u64)] */
#define FB_CMD_WANT_S       "W"
#define FB_CMD_GAP          'G'    /* [G, lost u64] */
#define FB_CMD_GAP_S        "G"
#define FB_CMD_TOOK         'a'    /* [a, n u64] */
#define FB_CMD_TOOK_S       "a"
#define FB_CMD_PONG         'q'    /* [q, token, instance(, lease u64)] */
#define FB_CMD_PONG_S       "q"
#define FB_CMD_STATS_REPLY  'R'    /* [R, json] */
#define FB_CMD_STATS_REPLY_S "R"
#define FB_CMD_KICK         'X'    /* [X, json {"reason": ...}] */
#define FB_CMD_KICK_S       "X"
#define FB_CMD_FLOW         'F'    /* [F, FB_FLOW_PAUSE | FB_FLOW_RESUME] */
#define FB_CMD_FLOW_S       "F"
#define FB_CMD_REFUSED      'N'    /* [N, seq u64, ops batch, json] */
#define FB_CMD_REFUSED_S    "N"
#define FB_CMD_NOTICE       'E'    /* [E, json {"dropped": n, "reason": ...}] */
#define FB_CMD_NOTICE_S     "E"

/* FLOW's one byte. */
#define FB_FLOW_PAUSE       0x00
#define FB_FLOW_PAUSE_S     "\x00"
#define FB_FLOW_RESUME      0x01
#define FB_FLOW_RESUME_S    "\x01"

/* A PING's third frame that asks for a filter lease (its PONG carries
 * one, u64 microseconds). */
#define FB_LEASE_ASK_S      "lease"
#define FB_LEASE_ASK_LEN    5

/* WANT's flags byte. */
#define FB_WANT_RESET       0x01u  /* the batch is the whole set, not a diff */

/* A subscription op's flags byte (the payload's first byte of each record
 * of an ops batch: SUB, WANT, REFUSED). */
#define FB_OP_F_SUBSCRIBE   0x01u  /* set: subscribe; clear: unsubscribe */
#define FB_OP_F_PREFIX      0x02u  /* the key is a prefix (never with GLOB or QUEUE) */
#define FB_OP_F_GLOB        0x04u  /* the key is a Redis glob */
#define FB_OP_F_QUEUE       0x08u  /* a queue group's: its name follows the flags byte */
#define FB_OP_F_HOLD        0x10u  /* with QUEUE: the group is held (a declaration, no membership) */
#define FB_OP_F_BIND        0x20u  /* with HOLD: the key is bound to a held group */

#endif /* FB_PROTOCOL_H */
