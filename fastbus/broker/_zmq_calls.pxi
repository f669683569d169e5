# The libzmq functions the broker's data plane calls, by address: those of
# the libzmq that pyzmq loaded (fastbus.broker._libzmq finds them; a socket
# handle is only valid in the library instance that made it).
# Part of fastbus/broker/_relay.pyx (included there).

# libzmq's zmq_msg_t (zmq.h, 4.x): 64 opaque bytes, pointer-aligned
# (csrc/fb_linkq.h, whose queues hold them).
ctypedef fb_zmq_msg fbz_msg

# libzmq's zmq_pollitem_t on POSIX (zmq.h).
cdef struct fbz_pollitem:
    void *socket
    int fd
    short events
    short revents

ctypedef void (*free_fn)(void *data, void *hint) noexcept nogil
ctypedef int (*f_msg_init)(fbz_msg *msg) noexcept nogil
ctypedef int (*f_msg_init_size)(fbz_msg *msg, size_t size) noexcept nogil
ctypedef int (*f_msg_init_data)(fbz_msg *msg, void *data, size_t size, free_fn ffn, void *hint) noexcept nogil
ctypedef int (*f_msg_close)(fbz_msg *msg) noexcept nogil
ctypedef int (*f_msg_recv)(fbz_msg *msg, void *s, int flags) noexcept nogil
ctypedef int (*f_msg_send)(fbz_msg *msg, void *s, int flags) noexcept nogil
ctypedef void *(*f_msg_data)(fbz_msg *msg) noexcept nogil
ctypedef size_t (*f_msg_size)(const fbz_msg *msg) noexcept nogil
ctypedef int (*f_msg_more)(const fbz_msg *msg) noexcept nogil
ctypedef int (*f_send)(void *s, const void *buf, size_t len, int flags) noexcept nogil
ctypedef int (*f_errno)() noexcept nogil
ctypedef const char *(*f_msg_gets)(const fbz_msg *msg, const char *prop) noexcept nogil
ctypedef int (*f_poll)(fbz_pollitem *items, int nitems, long timeout) noexcept nogil
ctypedef int (*f_getsockopt)(void *s, int option, void *optval, size_t *optvallen) noexcept nogil

cdef struct zmq_api:
    f_msg_init msg_init
    f_msg_init_size msg_init_size
    f_msg_init_data msg_init_data
    f_msg_close msg_close
    f_msg_recv msg_recv
    f_msg_send msg_send
    f_msg_data msg_data
    f_msg_size msg_size
    f_msg_more msg_more
    f_send send
    f_errno last_error
    f_msg_gets msg_gets
    f_poll poll
    f_getsockopt getsockopt

#: The libzmq functions the relay calls (``bind``'s keys).
FUNCTIONS = ("zmq_msg_init", "zmq_msg_init_size", "zmq_msg_init_data", "zmq_msg_close", "zmq_msg_recv", "zmq_msg_send",
             "zmq_msg_data", "zmq_msg_size", "zmq_msg_more", "zmq_send", "zmq_errno", "zmq_msg_gets",
             "zmq_poll", "zmq_getsockopt")

cdef zmq_api Z
#: Z's message calls, for the links' queues (csrc/fb_linkq.h).
cdef fb_zmq_msg_calls ZM
cdef bint _bound = False


def bind(dict addresses) -> None:
    """Take the libzmq functions (addresses, by name: FUNCTIONS)."""
    global _bound
    for name in FUNCTIONS:
        if not addresses.get(name):
            raise ValueError(f"no address for {name}")
    Z.msg_init = <f_msg_init><uintptr_t>addresses["zmq_msg_init"]
    Z.msg_init_size = <f_msg_init_size><uintptr_t>addresses["zmq_msg_init_size"]
    Z.msg_init_data = <f_msg_init_data><uintptr_t>addresses["zmq_msg_init_data"]
    Z.msg_close = <f_msg_close><uintptr_t>addresses["zmq_msg_close"]
    Z.msg_recv = <f_msg_recv><uintptr_t>addresses["zmq_msg_recv"]
    Z.msg_send = <f_msg_send><uintptr_t>addresses["zmq_msg_send"]
    Z.msg_data = <f_msg_data><uintptr_t>addresses["zmq_msg_data"]
    Z.msg_size = <f_msg_size><uintptr_t>addresses["zmq_msg_size"]
    Z.msg_more = <f_msg_more><uintptr_t>addresses["zmq_msg_more"]
    Z.send = <f_send><uintptr_t>addresses["zmq_send"]
    Z.last_error = <f_errno><uintptr_t>addresses["zmq_errno"]
    Z.msg_gets = <f_msg_gets><uintptr_t>addresses["zmq_msg_gets"]
    Z.poll = <f_poll><uintptr_t>addresses["zmq_poll"]
    Z.getsockopt = <f_getsockopt><uintptr_t>addresses["zmq_getsockopt"]
    ZM.init = Z.msg_init
    ZM.init_size = Z.msg_init_size
    ZM.close = Z.msg_close
    ZM.data = Z.msg_data
    _bound = True


def bound() -> bool:
    return _bound
