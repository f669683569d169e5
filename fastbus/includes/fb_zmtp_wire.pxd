# Mirrors csrc/fb_zmtp_wire.h (the parts a binding needs: none yet beyond
# the view of a received frame, which fb_zmtp.pxd's calls read).
cdef extern from "fb_zmtp_wire.h" nogil:
    enum:
        FB_ZMTP_GREETING
        FB_ZMTP_MAX_COMMAND
