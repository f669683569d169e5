"""Monitoring over HTTP: Prometheus ``/metrics``, JSON endpoints
(``/varz``, ``/connz``, ``/subsz``), ``/healthz`` and a live web page.

:class:`MonitorServer` serves a *source* (the interface is in
fastbus.monitor.http's doc); :class:`fastbus.monitor.broker.BrokerSource`
is the broker's (``fastbus broker --http 127.0.0.1:8222``), and
:class:`fastbus.monitor.queues.QueueSource` the queues, topics and inboxes
of a Redis server (``fastbus monitor --redis URL``),
:class:`fastbus.monitor.remote.RemoteBrokerSource` a broker polled from
elsewhere (``fastbus monitor --broker EP``), and :class:`CompositeSource`
several of them behind one server.
"""

from typing import TYPE_CHECKING

__all__ = ["CompositeSource", "MonitorServer", "Snapshots", "Source", "parse_address", "process_rss"]

# The names above, imported on first use (fastbus._lazy says why): the
# command-line parser imports fastbus.monitor.cli, not the HTTP server.
if TYPE_CHECKING:
    from fastbus.monitor.http import CompositeSource, MonitorServer, Snapshots, Source, parse_address, process_rss
else:
    from fastbus._lazy import attach

    __getattr__ = attach(__name__, __file__, globals())
