/*
 * fb_zmtp_wire.h - ZMTP 3.0's wire format (rfc.zeromq.org/spec/23), NULL
 * mechanism, as both ends of a connection speak it: the client's
 * (fb_zmtp.h, a DEALER) and the broker's (fb_zmtp_server.h, a ROUTER).
 *
 *   greeting   0xFF, 8 bytes padding, 0x7F, version 3.0, "NULL" padded to
 *              20 bytes, as-server, 31 bytes filler              (64 bytes)
 *   command    flags 0x04 (0x06: 8-byte size), size, name-length, name, data
 *   frame      flags 0x00 / 0x01 (more) / +0x02 (8-byte size), size, body
 *
 * After the greetings each side sends READY (its Socket-Type, as
 * properties: name-length byte, name, 4-byte big-endian value length,
 * value); then messages flow.
 *
 * Nothing here does I/O: byte buffers, and the parsing of what a peer
 * sent, every length checked against what is there.
 */
#ifndef FB_ZMTP_WIRE_H
#define FB_ZMTP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "fb_reader.h"    /* fb_zmq_msg */

#ifdef __cplusplus
extern "C" {
#endif

#define FB_ZMTP_GREETING 64
/* The longest command accepted (READY, PING: a few dozen bytes). */
#define FB_ZMTP_MAX_COMMAND 4096

/* A byte buffer: bytes [off, len) are live. */
typedef struct fb_zbuf {
    unsigned char *p;
    size_t off, len, cap;
} fb_zbuf;

/* Room for `more` bytes after len (the live bytes may slide to the front:
 * offsets into the buffer move by the old `off`).  0, or -1 (no memory). */
int fb_zbuf_reserve(fb_zbuf *b, size_t more);
int fb_zbuf_put(fb_zbuf *b, const void *data, size_t n);
/* Insert n bytes at offset *at (in [off, len]), what follows moved up;
 * *at then points past them (in the buffer as it now is).  0, or -1. */
int fb_zbuf_insert(fb_zbuf *b, size_t *at, const void *data, size_t n);
void fb_zbuf_free(fb_zbuf *b);

/* A frame's header for a body of `len` bytes (flags: 1 more, 4 command):
 * its length, 2 or 9 bytes written to h. */
size_t fb_zmtp_frame_header(unsigned char *h, int flags, size_t len);

/* The frame header at p (avail bytes there): its flags, header length and
 * body size.  0: not all here yet; 1: parsed; -1: not ZMTP (reserved
 * flag bits, a command with "more"). */
int fb_zmtp_parse_header(const unsigned char *p, size_t avail, int *flags, size_t *hlen, uint64_t *size);

/* What comes next in a peer's input p[0, len) (after the greetings):
 *   FB_ZMTP_MESSAGE  a whole message starts at p (all its frames are here);
 *   FB_ZMTP_COMMAND  a whole command: its body at p + *body, *size bytes
 *                    (the caller consumes it, up to *body + *size);
 *   FB_ZMTP_PARTIAL  not all here: *need more bytes at least (0: a header);
 *   FB_ZMTP_BAD      not what a peer may send: reserved flags, a command
 *                    inside a message or over FB_ZMTP_MAX_COMMAND, data
 *                    before the handshake (!ready), a message over max_msg.
 * Every length is checked against len and max_msg before it is used. */
enum { FB_ZMTP_BAD = -1, FB_ZMTP_PARTIAL = 0, FB_ZMTP_MESSAGE = 1, FB_ZMTP_COMMAND = 2 };
int fb_zmtp_next(const unsigned char *p, size_t len, int ready, uint64_t max_msg,
                 size_t *body, uint64_t *size, size_t *need);

/* Where the last whole message in p[0, len) ends (commands between
 * messages count as whole; `inside`: p starts inside a message, whose
 * rest does not): what a lost connection leaves to be received. */
size_t fb_zmtp_whole_end(const unsigned char *p, size_t len, int inside, uint64_t max_msg);

/* Past the commands at the front of p[0, len) (of input whose messages
 * fb_zmtp_whole_end found whole): the offset of the first data frame, or
 * len. */
size_t fb_zmtp_skip_commands(const unsigned char *p, size_t len);

/* Our greeting (as_server: the flag; NULL ignores it, libzmq sends 0). */
void fb_zmtp_greeting(unsigned char g[FB_ZMTP_GREETING], int as_server);
/* Is a peer's greeting ZMTP 3 or later with the NULL mechanism? */
int fb_zmtp_greeting_ok(const unsigned char g[FB_ZMTP_GREETING]);

/* Append READY saying `socket_type`, framed, to b.  0 or -1 (no memory). */
int fb_zmtp_put_ready(fb_zbuf *b, const char *socket_type);

/* Is the command body `name` (its name-length byte and name)? */
int fb_zmtp_is_command(const unsigned char *body, uint64_t size, const char *name);

/* A READY's Socket-Type: 1 and the value (a view of body), or 0 if it has
 * none or its properties run past the body. */
int fb_zmtp_ready_type(const unsigned char *body, uint64_t size, const unsigned char **type, size_t *len);

/* A PONG answering the PING command `body` (its context: up to 16 bytes
 * after the TTL), framed, into f (room for 32 bytes): its length, or 0 if
 * body is no well-formed PING. */
size_t fb_zmtp_pong(unsigned char *f, const unsigned char *body, uint64_t size);

/* fb_zmq_msg's 64 bytes as both ends use them: a view of a received
 * frame in the connection's input buffer (valid until the next receive on
 * the connection), and for the broker's end the peer's address. */
typedef struct fb_zmtp_view {
    unsigned char *data;
    size_t size;
    int more;
    const char *peer;            /* "Peer-Address" (NULL: none, an ipc peer) */
} fb_zmtp_view;
_Static_assert(sizeof(fb_zmtp_view) <= sizeof(fb_zmq_msg), "fb_zmtp_view must fit in fb_zmq_msg");

#ifdef __cplusplus
}
#endif
#endif /* FB_ZMTP_WIRE_H */
