# Mirrors csrc/fb_linkq.h
from libc.stdint cimport uint8_t, uint32_t, uint64_t

from fastbus.includes.fb_zmq_msg cimport fb_zmq_msg

cdef extern from "fb_linkq.h" nogil:
    ctypedef struct fb_zmq_msg_calls:
        int (*init)(fb_zmq_msg *msg) noexcept nogil
        int (*init_size)(fb_zmq_msg *msg, size_t size) noexcept nogil
        int (*close)(fb_zmq_msg *msg) noexcept nogil
        void *(*data)(fb_zmq_msg *msg) noexcept nogil
        int (*init_data)(fb_zmq_msg *msg, void *data, size_t size, void (*ffn)(void *, void *) noexcept nogil,
                         void *hint) noexcept nogil

    enum:
        FB_Q_FRAMES
        FB_Q_WANT_MARK
        FB_Q_FLOW_MARK
        FB_Q_MARK_WANT
        FB_Q_MARK_FLOW
        FB_Q_ENTRY_BYTES

    ctypedef struct fb_qentry:
        fb_qentry *next
        uint64_t records
        size_t size
        uint32_t done
        uint8_t kind
        uint8_t cmd
        uint8_t nframes
        fb_zmq_msg frames[1]

    ctypedef struct fb_linkq:
        fb_qentry *head
        fb_qentry *tail
        size_t bytes
        uint64_t lost
        uint8_t marks

    fb_qentry *fb_qentry_new(const fb_zmq_msg_calls *z, int nframes)
    void fb_qentry_free(const fb_zmq_msg_calls *z, fb_qentry *e)
    int fb_qentry_frame(const fb_zmq_msg_calls *z, fb_qentry *e, int i, const void *data, size_t n)
    int fb_qentry_own(const fb_zmq_msg_calls *z, fb_qentry *e, int i, unsigned char *buf, size_t n)
    void fb_linkq_push(fb_linkq *q, fb_qentry *e)
    void fb_linkq_push_front(fb_linkq *q, fb_qentry *e)
    void fb_linkq_pop(const fb_zmq_msg_calls *z, fb_linkq *q)
    void fb_linkq_clear(const fb_zmq_msg_calls *z, fb_linkq *q)
    uint64_t fb_linkq_drop_data(const fb_zmq_msg_calls *z, fb_linkq *q, size_t limit)
    int fb_linkq_collapse(const fb_zmq_msg_calls *z, fb_linkq *q, uint8_t cmd, uint8_t mark, uint8_t kind)
