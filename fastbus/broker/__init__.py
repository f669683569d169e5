"""The fastbus broker: batched pub/sub over ZeroMQ with diff-only
subscription forwarding, federation and publisher-side filtering.

``Broker(BrokerConfig(...)).run()`` (or ``fastbus broker``) serves.  The
package, one concern a module:

* ``config``      - BrokerConfig (the settings) and check_endpoint.
* ``links``       - the link kinds (client session, downstream broker,
                    upstream broker, plain-ZeroMQ XPUB) and how each sends.
* ``interest``    - who wants what: the trie, the forwarders, WANT/SUB diffs.
* ``sending``     - batches out at the end of each turn, per-link send
                    queues, the slow-consumer policy, FLOW pause/resume.
* ``sessions``    - the ROUTER socket: client and downstream-broker sessions.
* ``federation``  - our link to an upstream broker.
* ``compat``      - plain ZeroMQ XPUB/XSUB/PULL sockets.
* ``loop``        - Broker: lifecycle, the poll loop, maintenance, stats.

Per-message work is in C (``fastbus.Router``): one call routes a received
batch into the outboxes of every matching link.  docs/PROTOCOL.md describes
the frames.
"""

from .config import SLOW_POLICIES, BrokerConfig, check_endpoint
from .loop import Broker

__all__ = ["Broker", "BrokerConfig", "SLOW_POLICIES", "check_endpoint"]
