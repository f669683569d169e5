"""Plain-ZeroMQ compatibility: an XPUB socket for plain SUB sockets
(``--zmq-pub``), and XSUB and PULL sockets for plain PUB and PUSH sockets
(``--zmq-sub``, ``--zmq-pull``); messages are two frames, [channel, payload].

The SUB sockets behind the XPUB are one link (an XPubLink) whose
subscriptions are their prefixes; XPUB filters per subscriber.  Messages
from plain publishers are batched as they are read (one batch per turn, or
per ``max_messages``/``max_bytes``) and routed like any received batch,
from a link id of their own that nobody subscribes with.
"""

from __future__ import annotations

import logging

import zmq

from fastbus._core import SUBSCRIBE, UNSUBSCRIBE, Outbox

from .config import RECV_BUDGET
from .links import XPubLink



log = logging.getLogger("fastbus.broker")


class Compat:
    """The compatibility sockets of a broker, and their handlers."""

    def __init__(self, broker) -> None:
        self.b = broker
        cfg = broker.config
        ctx = broker._ctx
        self.xpub: XPubLink | None = None
        if cfg.zmq_pub:
            xs = ctx.socket(zmq.XPUB)
            xs.xpub_verboser = 1          # every (un)subscribe, so counts stay right
            xs.xpub_nodrop = 1
            xs.linger = 0
            for ep in cfg.zmq_pub:
                broker.bind(xs, ep)
            self.xpub = XPubLink(broker.links.new_id(), "zmq-pub", xs)
            broker.add_link(self.xpub)
            broker.relay.set_xpub(self.xpub.link, xs)      # the data plane sends it a message per record
            broker.handlers[xs] = self.on_xpub
        self._batch = Outbox(max_messages=cfg.max_messages, max_bytes=cfg.max_bytes, max_delay=None)
        self._source = broker.links.new_id()     # the source of messages from plain publishers
        for eps, kind in ((cfg.zmq_sub, zmq.XSUB), (cfg.zmq_pull, zmq.PULL)):
            if eps:
                s = ctx.socket(kind)
                s.linger = 0
                s.maxmsgsize = cfg.max_message_bytes
                for ep in eps:
                    broker.bind(s, ep)
                if kind == zmq.XSUB:
                    s.send(b"\x01")        # everything: plain publishers are not filtered
                broker.handlers[s] = lambda s=s: self.on_input(s)

    def on_xpub(self) -> None:
        """Plain SUB sockets (un)subscribing: prefix keys of the XPUB link."""
        xs = self.xpub.sock
        ops = []
        for _ in range(RECV_BUDGET):
            try:
                msg = xs.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if not msg or msg[0] not in (0, 1):
                self.b.drops["protocol"] += 1
                continue
            ops.append((SUBSCRIBE if msg[0] == 1 else UNSUBSCRIBE, msg[1:], True))
        if ops:
            refused = self.b.interest.apply(self.xpub, ops)
            if refused:
                log.warning("refused %d subscriptions of plain ZeroMQ subscribers: %s", len(refused),
                            refused[0][2])

    def on_input(self, sock: zmq.Socket) -> None:
        """Messages from plain PUB/PUSH sockets: [channel, payload]."""
        b = self.b
        cfg = b.config
        batch = self._batch
        for _ in range(RECV_BUDGET):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) == 2:
                topic, payload = frames
            elif len(frames) == 1:
                topic, payload = frames[0], b""
            else:
                b.drops["protocol"] += 1
                continue
            if len(topic) > cfg.max_topic or len(payload) > cfg.max_payload:
                b.drops["protocol"] += 1
                continue
            if batch.append(topic, payload):
                b.route(batch.take(), self._source)
        if len(batch):
            b.route(batch.take(), self._source)
