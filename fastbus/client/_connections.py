"""The owner of a client's connections.

A ``Client`` has one ``Connections``: the options it was given, the ZeroMQ
context, the keeper thread, and the sessions (``_session.Session``) open on
them, each with its lock and native threads.  Sessions and PubSubs are given
this object, never the Client: nothing below ``Client`` knows it, and a
session reads its settings from ``options`` alone.
"""

from __future__ import annotations

from typing import Protocol

import zmq

from fastbus.client._keeper import Keeper
from fastbus.client._options import ClientOptions
from fastbus.client._session import Session


class Member(Protocol):
    """What a client closes with itself (a PubSub)."""

    def shutdown(self, timeout: float = 5.0) -> None: ...


class Connections:
    """A client's options, context and keeper, and what is open on them."""

    def __init__(self, options: ClientOptions, context: zmq.Context | None = None,
                 driven_by_loop: bool = False) -> None:
        self.options = options
        self.context = context or zmq.Context.instance()
        #: Driven by an event loop (the asyncio twin): the loop sends (no
        #: native sender), and its sessions' native readers wake the loop
        #: (Session.drive_from).
        self.driven_by_loop = driven_by_loop
        self.keeper = Keeper(options.name)
        self.members: list[Member] = []
        self.closed = False

    def start(self) -> None:
        self.keeper.start()

    def open(self, session: Session) -> None:
        """Connect a new session and have the keeper serve it while no user
        thread does."""
        session.hold()                    # (free: nobody else knows the session yet)
        try:
            session.open()
        finally:
            session.release()
        self.keeper.add(session)

    def forget(self, session: Session) -> None:
        """A closed session: the keeper no longer looks at it."""
        self.keeper.remove(session)

    def join(self, member: Member) -> None:
        self.members.append(member)

    def leave(self, member: Member) -> None:
        if member in self.members:
            self.members.remove(member)

    def shutdown(self, timeout: float) -> None:
        """Stop the keeper and close every member (the client's own session
        is the client's to close, after this)."""
        self.closed = True
        self.keeper.stop(timeout)
        for m in list(self.members):
            m.shutdown(timeout)

    def stop_keeper(self) -> None:
        """At garbage collection of an unclosed client."""
        self.keeper.stop(1.0)
