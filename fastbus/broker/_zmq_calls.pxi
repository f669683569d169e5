# The libzmq functions the broker's data plane calls, by address: those of
# the libzmq that pyzmq loaded (fastbus.broker._libzmq finds them; a socket
# handle is only valid in the library instance that made it).
# Part of fastbus/broker/_relay.pyx (included there).

# The table's shape, libzmq's zmq_pollitem_t and the calls' types are C's
# (csrc/fb_zmq_api.h), so C code the relay calls can take the same table.
from fastbus.includes.fb_zmq_api cimport (fb_zmq_api, fb_zmq_errno_fn, fb_zmq_getsockopt_fn, fb_zmq_msg_close_fn,
                                          fb_zmq_msg_data_fn, fb_zmq_msg_gets_fn, fb_zmq_msg_init_data_fn,
                                          fb_zmq_msg_init_fn, fb_zmq_msg_init_size_fn, fb_zmq_msg_more_fn,
                                          fb_zmq_msg_recv_fn, fb_zmq_msg_send_fn, fb_zmq_msg_size_fn, fb_zmq_poll_fn,
                                          fb_zmq_pollitem, fb_zmq_send_fn)

#: The libzmq functions the relay calls (``bind``'s keys).
FUNCTIONS = ("zmq_msg_init", "zmq_msg_init_size", "zmq_msg_init_data", "zmq_msg_close", "zmq_msg_recv", "zmq_msg_send",
             "zmq_msg_data", "zmq_msg_size", "zmq_msg_more", "zmq_send", "zmq_errno", "zmq_msg_gets",
             "zmq_poll", "zmq_getsockopt")

cdef fb_zmq_api Z
#: Z's message calls, for the links' queues (csrc/fb_linkq.h).
cdef fb_zmq_msg_calls ZM
cdef bint _bound = False


def bind(dict addresses) -> None:
    """Take the libzmq functions (addresses, by name: FUNCTIONS)."""
    global _bound
    for name in FUNCTIONS:
        if not addresses.get(name):
            raise ValueError(f"no address for {name}")
    Z.msg_init = <fb_zmq_msg_init_fn><uintptr_t>addresses["zmq_msg_init"]
    Z.msg_init_size = <fb_zmq_msg_init_size_fn><uintptr_t>addresses["zmq_msg_init_size"]
    Z.msg_init_data = <fb_zmq_msg_init_data_fn><uintptr_t>addresses["zmq_msg_init_data"]
    Z.msg_close = <fb_zmq_msg_close_fn><uintptr_t>addresses["zmq_msg_close"]
    Z.msg_recv = <fb_zmq_msg_recv_fn><uintptr_t>addresses["zmq_msg_recv"]
    Z.msg_send = <fb_zmq_msg_send_fn><uintptr_t>addresses["zmq_msg_send"]
    Z.msg_data = <fb_zmq_msg_data_fn><uintptr_t>addresses["zmq_msg_data"]
    Z.msg_size = <fb_zmq_msg_size_fn><uintptr_t>addresses["zmq_msg_size"]
    Z.msg_more = <fb_zmq_msg_more_fn><uintptr_t>addresses["zmq_msg_more"]
    Z.send = <fb_zmq_send_fn><uintptr_t>addresses["zmq_send"]
    Z.last_error = <fb_zmq_errno_fn><uintptr_t>addresses["zmq_errno"]
    Z.msg_gets = <fb_zmq_msg_gets_fn><uintptr_t>addresses["zmq_msg_gets"]
    Z.poll = <fb_zmq_poll_fn><uintptr_t>addresses["zmq_poll"]
    Z.getsockopt = <fb_zmq_getsockopt_fn><uintptr_t>addresses["zmq_getsockopt"]
    ZM.init = Z.msg_init
    ZM.init_size = Z.msg_init_size
    ZM.close = Z.msg_close
    ZM.data = Z.msg_data
    ZM.init_data = Z.msg_init_data
    _bound = True


def bound() -> bool:
    return _bound
