# The broker's own ROUTER end (csrc/fb_zmtp_server.h): Listener, and the
# call table through which the relay uses it as it uses a libzmq ROUTER.
# Part of fastbus/broker/_relay.pyx (included there).

from libc.errno cimport errno
from libc.string cimport strerror

from fastbus.includes.fb_reader cimport fb_zmq_msg
from fastbus.includes.fb_zmtp cimport (fb_zmtp, fb_zmtp_msg_init, fb_zmtp_msg_data, fb_zmtp_msg_size,
                                       fb_zmtp_msg_more, fb_zmtp_msg_close, fb_zmtp_msg_recv, fb_zmtp_send,
                                       fb_zmtp_getsockopt, fb_zmtp_buffered)
from fastbus.includes.fb_zmtp_server cimport (fb_zmtp_server, fb_zmtp_server_options, fb_zmtp_server_stats,
                                              fb_zmtp_server_new, fb_zmtp_server_listen, fb_zmtp_server_close,
                                              fb_zmtp_server_listen_resp, fb_zmtp_server_routed,
                                              fb_zmtp_server_close_peer,
                                              fb_zmtp_server_free,
                                              fb_zmtp_server_send, fb_zmtp_server_getsockopt,
                                              fb_zmtp_server_msg_recv, fb_zmtp_server_msg_gets,
                                              fb_zmtp_server_buffered, fb_zmtp_server_expire, fb_zmtp_server_unsent,
                                              fb_zmtp_server_get_stats, fb_zmtp_server_take_gone,
                                              FB_ZMTP_SERVER_ID_LEN)

from fastbus.endpoints import endpoint_of as _endpoint_of, sockaddr as _sockaddr


cdef int _last_errno() noexcept nogil:
    return errno


cdef int _send_zmq_msg(fb_zmq_msg *m, void *s, int flags) noexcept nogil:
    """zmq_msg_send for a Listener.  What the relay sends as a message (a
    queued entry's frames, a large batch) is a libzmq message: its bytes go
    by copy, and the message is consumed, as libzmq's zmq_msg_send consumes
    it (closed, and left empty for a later close)."""
    cdef int rc = fb_zmtp_server_send(s, Z.msg_data(m), Z.msg_size(m), flags)
    if rc >= 0:
        Z.msg_close(m)
        Z.msg_init(m)
    return rc


# The Listener's calls, in the table the relay calls a ROUTER through (its
# received frames are views: fb_zmtp's msg calls read them; the messages it
# sends are libzmq's, _send_zmq_msg).  What the relay never does on its
# ROUTER (msg_init_data, msg_init_size: those make libzmq messages) is NULL.
cdef fb_zmq_api _NATIVE
_NATIVE.msg_init = <fb_zmq_msg_init_fn>fb_zmtp_msg_init
_NATIVE.msg_init_size = NULL
_NATIVE.msg_init_data = NULL
_NATIVE.msg_close = <fb_zmq_msg_close_fn>fb_zmtp_msg_close
_NATIVE.msg_recv = <fb_zmq_msg_recv_fn>fb_zmtp_server_msg_recv
_NATIVE.msg_send = _send_zmq_msg
_NATIVE.msg_data = <fb_zmq_msg_data_fn>fb_zmtp_msg_data
_NATIVE.msg_size = <fb_zmq_msg_size_fn>fb_zmtp_msg_size
_NATIVE.msg_more = <fb_zmq_msg_more_fn>fb_zmtp_msg_more
_NATIVE.send = <fb_zmq_send_fn>fb_zmtp_server_send
_NATIVE.last_error = _last_errno
_NATIVE.msg_gets = <fb_zmq_msg_gets_fn>fb_zmtp_server_msg_gets
_NATIVE.poll = NULL                   # (the relay polls through libzmq's zmq_poll: the Listener is a descriptor)
_NATIVE.getsockopt = <fb_zmq_getsockopt_fn>fb_zmtp_server_getsockopt


cdef int _send_zmq_msg_up(fb_zmq_msg *m, void *z, int flags) noexcept nogil:
    """zmq_msg_send for the upstream link's Stream (fb_zmtp.h), as
    _send_zmq_msg for a Listener: by copy, the message consumed."""
    cdef int rc = fb_zmtp_send(z, Z.msg_data(m), Z.msg_size(m), flags)
    if rc >= 0:
        Z.msg_close(m)
        Z.msg_init(m)
    return rc


# The calls of the upstream link when it is a Stream (fastbus.client's
# native DEALER connection, csrc/fb_zmtp.h: no libzmq I/O thread, and
# what upstream did not take goes again after a cut), the table the relay
# calls that link through.  Its received frames are views (the relay
# copies a message it keeps for Python).
cdef fb_zmq_api _STREAM
_STREAM.msg_init = <fb_zmq_msg_init_fn>fb_zmtp_msg_init
_STREAM.msg_init_size = NULL
_STREAM.msg_init_data = NULL
_STREAM.msg_close = <fb_zmq_msg_close_fn>fb_zmtp_msg_close
_STREAM.msg_recv = <fb_zmq_msg_recv_fn>fb_zmtp_msg_recv
_STREAM.msg_send = _send_zmq_msg_up
_STREAM.msg_data = <fb_zmq_msg_data_fn>fb_zmtp_msg_data
_STREAM.msg_size = <fb_zmq_msg_size_fn>fb_zmtp_msg_size
_STREAM.msg_more = <fb_zmq_msg_more_fn>fb_zmtp_msg_more
_STREAM.send = <fb_zmq_send_fn>fb_zmtp_send
_STREAM.last_error = _last_errno
_STREAM.msg_gets = NULL
_STREAM.poll = NULL
_STREAM.getsockopt = <fb_zmq_getsockopt_fn>fb_zmtp_getsockopt


cdef class Listener:
    """The broker's ROUTER socket without libzmq's I/O thread: it listens
    on TCP and Unix sockets and speaks ZMTP (NULL mechanism) itself, read
    and written by the relay's own thread (csrc/fb_zmtp_server.h), so a
    message crosses no thread in the broker.  Clients cannot tell: any
    ZeroMQ DEALER connects to it.

    It has the part of a pyzmq ROUTER socket the broker uses: ``bind()``
    (tcp://HOST:PORT, port 0 for one the system picks; ipc://PATH,
    ipc://@NAME), ``last_endpoint``, ``close(linger)``, ``closed``, and the
    options given at construction (``sndhwm``: whole messages queued per
    peer beyond the kernel's buffer; ``rcvbuf``/``sndbuf``; TCP keepalive;
    ``maxmsgsize``).  ``FD``: its descriptor (readable while it has work),
    ``stats()``: its counters; ``expire()`` closes connections that never
    finished their handshake (the broker calls it at each maintenance)."""

    cdef fb_zmtp_server *_s           # (freed with the Listener: a Relay holding it finds it closed)
    cdef bint _closed
    cdef readonly int FD
    cdef readonly bytes last_endpoint
    cdef readonly list endpoints

    def __cinit__(self, int sndhwm=16, int rcvbuf=0, int sndbuf=0, long long maxmsgsize=-1,
                  int tcp_keepalive_idle=0, int tcp_keepalive_intvl=0, int tcp_keepalive_cnt=0,
                  bint resp_auth_required=False):
        cdef fb_zmtp_server_options o
        cdef int err = 0, v = -1
        cdef size_t sz = sizeof(int)
        memset(&o, 0, sizeof(o))
        o.sndhwm = sndhwm if sndhwm > 0 else 1
        o.rcvbuf = rcvbuf if rcvbuf > 0 else 0
        o.sndbuf = sndbuf if sndbuf > 0 else 0
        o.max_msg_bytes = <uint64_t>maxmsgsize if maxmsgsize > 0 else (<uint64_t>1 << 62)
        o.keepalive_idle_s = tcp_keepalive_idle
        o.keepalive_intvl_s = tcp_keepalive_intvl
        o.keepalive_cnt = tcp_keepalive_cnt
        o.resp_auth_required = resp_auth_required
        self._s = fb_zmtp_server_new(&o, &err)
        if self._s is NULL:
            raise zmq.ZMQError(err, f"cannot make a listener: {strerror(err).decode()}")
        fb_zmtp_server_getsockopt(self._s, ZMQ_FD, &v, &sz)
        self.FD = v
        self.last_endpoint = b""
        self.endpoints = []

    def __dealloc__(self):
        fb_zmtp_server_free(self._s)
        self._s = NULL

    @staticmethod
    def supports(str endpoint) -> bool:
        """Can a Listener listen on ``endpoint`` (tcp:// or ipc:// on Linux)?"""
        return _sockaddr(endpoint, listen=True) is not None

    def bind(self, str endpoint, bint resp=False) -> None:
        """Listen on ``endpoint``; zmq.ZMQError with the errno if it cannot
        (EADDRINUSE: another socket listens there).  ``resp``: Redis
        clients may connect there too (csrc/fb_resp_session.h: each is a
        session of the broker's), as well as fastbus's."""
        if self._closed:
            raise zmq.ZMQError(zmq.ENOTSOCK, "the listener is closed")
        address = _sockaddr(endpoint, listen=True)
        if address is None:
            raise zmq.ZMQError(zmq.EINVAL, f"a listener takes tcp://HOST:PORT or ipc://PATH, not {endpoint!r}")
        cdef unsigned char bound[128]
        cdef size_t boundlen = sizeof(bound)
        cdef bytes a = address
        cdef int rc
        if resp:
            rc = fb_zmtp_server_listen_resp(self._s, PyBytes_AS_STRING(a), <size_t>PyBytes_GET_SIZE(a),
                                            bound, &boundlen)
        else:
            rc = fb_zmtp_server_listen(self._s, PyBytes_AS_STRING(a), <size_t>PyBytes_GET_SIZE(a),
                                       bound, &boundlen)
        if rc:
            raise zmq.ZMQError(rc, strerror(rc).decode())
        name = _endpoint_of(PyBytes_FromStringAndSize(<char *>bound, boundlen)) if boundlen > 2 else endpoint
        if name.startswith("ipc://") and endpoint.startswith("ipc://"):
            name = endpoint                   # (as given: a relative path stays relative, as libzmq says it)
        self.last_endpoint = name.encode()
        self.endpoints.append(name)

    @property
    def closed(self) -> bool:
        return self._closed

    def close_peer(self, bytes ident not None, bint any_peer=False) -> bool:
        """Close a Redis client's connection (routing id ``ident``) whose
        session ended, as Redis closes a client over its output buffer
        limit; False for anything else (a fastbus peer is told, by KICK),
        but with ``any_peer`` (a peer stuck, taking nothing: reset)."""
        if self._closed:
            return False
        return fb_zmtp_server_close_peer(self._s, <const unsigned char *>PyBytes_AS_STRING(ident),
                                         <size_t>PyBytes_GET_SIZE(ident), any_peer) == 1

    def close(self, linger=None) -> None:
        """Close every connection and listener; whole messages still queued
        for a peer get up to ``linger`` ms (None: none) to leave."""
        cdef int ms = 0 if linger is None or linger < 0 else linger
        if self._closed:
            return
        self._closed = True
        with nogil:
            fb_zmtp_server_close(self._s, ms)

    def expire(self, double handshake_s) -> int:
        """Close the connections that have not finished their ZMTP
        handshake within ``handshake_s`` seconds of being accepted (as
        libzmq's ROUTER does after 30 s): the number closed."""
        if self._closed:
            return 0
        return fb_zmtp_server_expire(self._s, <uint64_t>(handshake_s * 1e9) if handshake_s > 0 else 0)

    def stats(self) -> dict:
        """Its counters: connections accepted and open, lost, closed for
        bad input, whole messages lost with a peer, and syscalls made."""
        cdef fb_zmtp_server_stats st
        fb_zmtp_server_get_stats(self._s, &st)
        return {"accepted": st.accepted, "connections": st.connections, "disconnects": st.disconnects,
                "protocol_errors": st.protocol_errors, "dropped_messages": st.dropped_messages,
                "handshake_timeouts": st.handshake_timeouts, "resp_accepted": st.resp_accepted,
                "syscalls_send": st.syscalls_send, "syscalls_recv": st.syscalls_recv,
                "syscalls_poll": st.syscalls_poll}
