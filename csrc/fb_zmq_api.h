/*
 * fb_zmq_api.h - the libzmq calls a broker's data plane makes, as a table
 * of function pointers, and libzmq's zmq_pollitem_t: for C code that calls
 * libzmq without including zmq.h or linking it.
 *
 * The table is filled with the addresses of the libzmq that pyzmq loaded
 * (fastbus/broker/_libzmq.py finds them: a socket handle is only valid in
 * the library instance that made it), or with calls of the same signatures
 * for a socket that is not libzmq's: a Listener (fb_zmtp_server.h) or an
 * upstream Stream (fb_zmtp.h), whose received frames are views.  A call a
 * kind of socket never needs is NULL there (documented where it is filled:
 * fastbus/broker/_listener.pxi).  Signatures and values are zmq.h's (4.x).
 */
#ifndef FB_ZMQ_API_H
#define FB_ZMQ_API_H

#include <stddef.h>

#include "fb_zmq_msg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* zmq_pollitem_t on POSIX. */
typedef struct fb_zmq_pollitem {
    void *socket;
    int fd;
    short events;
    short revents;
} fb_zmq_pollitem;

/* zmq_free_fn: how zmq_msg_init_data's caller frees the data. */
typedef void (*fb_zmq_free_fn)(void *data, void *hint);

typedef int (*fb_zmq_msg_init_fn)(fb_zmq_msg *msg);
typedef int (*fb_zmq_msg_init_size_fn)(fb_zmq_msg *msg, size_t size);
typedef int (*fb_zmq_msg_init_data_fn)(fb_zmq_msg *msg, void *data, size_t size, fb_zmq_free_fn ffn, void *hint);
typedef int (*fb_zmq_msg_close_fn)(fb_zmq_msg *msg);
typedef int (*fb_zmq_msg_recv_fn)(fb_zmq_msg *msg, void *s, int flags);
typedef int (*fb_zmq_msg_send_fn)(fb_zmq_msg *msg, void *s, int flags);
typedef void *(*fb_zmq_msg_data_fn)(fb_zmq_msg *msg);
typedef size_t (*fb_zmq_msg_size_fn)(const fb_zmq_msg *msg);
typedef int (*fb_zmq_msg_more_fn)(const fb_zmq_msg *msg);
typedef int (*fb_zmq_send_fn)(void *s, const void *buf, size_t len, int flags);
typedef int (*fb_zmq_errno_fn)(void);
typedef const char *(*fb_zmq_msg_gets_fn)(const fb_zmq_msg *msg, const char *prop);
typedef int (*fb_zmq_poll_fn)(fb_zmq_pollitem *items, int nitems, long timeout);
typedef int (*fb_zmq_getsockopt_fn)(void *s, int option, void *optval, size_t *optvallen);

/* One socket's calls (zmq_msg_init is msg_init, zmq_errno last_error...). */
typedef struct fb_zmq_api {
    fb_zmq_msg_init_fn msg_init;
    fb_zmq_msg_init_size_fn msg_init_size;
    fb_zmq_msg_init_data_fn msg_init_data;
    fb_zmq_msg_close_fn msg_close;
    fb_zmq_msg_recv_fn msg_recv;
    fb_zmq_msg_send_fn msg_send;
    fb_zmq_msg_data_fn msg_data;
    fb_zmq_msg_size_fn msg_size;
    fb_zmq_msg_more_fn msg_more;
    fb_zmq_send_fn send;
    fb_zmq_errno_fn last_error;
    fb_zmq_msg_gets_fn msg_gets;
    fb_zmq_poll_fn poll;
    fb_zmq_getsockopt_fn getsockopt;
} fb_zmq_api;

#ifdef __cplusplus
}
#endif

#endif /* FB_ZMQ_API_H */
