"""The fastbus broker: batched pub/sub over ZeroMQ with diff-only
subscription forwarding, federation and publisher-side filtering.

``Broker(BrokerConfig(...)).run()`` (or ``fastbus broker``) serves.  The
package, one concern a module:

* ``config``      - BrokerConfig (the settings) and check_endpoint.
* ``loop``        - Broker: lifecycle, the poll loop, maintenance, stats.
* ``_relay``      - the data plane, in C without the interpreter lock: the
                    poll, routing, links' queues and leases, the client
                    endpoints' ZMTP (its Listener, csrc/fb_zmtp_server.h),
                    the journal's writes; ``_libzmq`` binds it to pyzmq's
                    libzmq.
* ``links``       - the link kinds (client session, downstream broker,
                    upstream broker, plain-ZeroMQ XPUB) and how each sends.
* ``sessions``    - client and downstream-broker sessions: HELLO, resume,
                    control messages, on the Listener's connections.
* ``interest``    - who wants what: the trie, the forwarders, WANT/SUB
                    diffs, queue groups and held groups.
* ``settle``      - confirmations that wait until every publisher's filter
                    has a subscription (ACKs, leases).
* ``sending``     - what Python decides of what goes out: control
                    messages, the data plane's events, slow consumers,
                    flow control.
* ``federation``  - our link to an upstream broker.
* ``journal``     - --journal: sessions and held groups through a restart.
* ``resp``        - what a Redis client on --resp asks besides pub/sub.
* ``compat``      - plain ZeroMQ XPUB/XSUB/PULL sockets.
* ``memory``      - memory given back to the system (malloc's thresholds).

Per-message work is in C (``fastbus.Router``, the relay): one call routes a
received batch into the outboxes of every matching link.  docs/PROTOCOL.md
describes the frames, docs/ARCHITECTURE.md a message's way through them.
"""

from .config import SLOW_POLICIES, BrokerConfig, check_endpoint
from .loop import Broker

__all__ = ["Broker", "BrokerConfig", "SLOW_POLICIES", "check_endpoint"]
