# RespPump's C state (fb_resp.h).
from fastbus.includes.fb_resp cimport fb_resp_reader


cdef class RespPump:
    cdef fb_resp_reader _rd
    cdef readonly tuple last
