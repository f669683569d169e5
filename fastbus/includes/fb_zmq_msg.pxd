# Mirrors csrc/fb_zmq_msg.h

cdef extern from "fb_zmq_msg.h" nogil:
    ctypedef union fb_zmq_msg:
        pass
