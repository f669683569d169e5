# QueueMessage: a fastbus.queue message (its wire layout: _layout.pyx).


cdef class QueueMessage:
    cdef readonly object id
    cdef readonly bytes payload
    cdef readonly double created_at
    cdef readonly long deliveries
    cdef readonly bytes _key           # the id as 8 big-endian bytes: its field in the unacked hash
    cdef readonly object _consumer
