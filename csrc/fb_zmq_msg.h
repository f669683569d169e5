/*
 * fb_zmq_msg.h - libzmq's zmq_msg_t, for the C code that holds libzmq
 * messages without including zmq.h (the libzmq in use is the one pyzmq
 * loaded, called through function pointers: fb_reader.h, fb_linkq.h),
 * and for the ZMTP code that fills the same shape (fb_zmtp.h).
 */
#ifndef FB_ZMQ_MSG_H
#define FB_ZMQ_MSG_H

/* zmq.h, 4.x: 64 opaque bytes, pointer-aligned. */
typedef union fb_zmq_msg {
    unsigned char _[64];
    void *p;
    double d;
    long long l;
} fb_zmq_msg;

#endif /* FB_ZMQ_MSG_H */
