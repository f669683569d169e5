"""The keeper: a client's background thread, for the sessions nobody drives.

It is not on the way of a message a user thread publishes or reads: those
threads use the socket themselves (``_session``), and while none does, the
client's native threads (``_engine``) send what a burst left, read for a
PubSub nobody is reading, answer the broker's WANTs, FLOWs and leases, and
ping it.  The keeper does what those hand back: the broker's confirmations
and notices, a new broker instance (HELLO again, and the subscriptions),
control frames that waited for room.  A client at rest, or one the broker
pauses and resumes, never wakes it.
Without the native engine (pyzmq's libzmq not found) it does all of it:
it then sleeps in ``poll()`` on the sessions' notification descriptors
(ZMQ_FD) and its own wake pipe, never on a timer shorter than the next
ping, except the linger a user asked for.
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastbus.client._session import Session

log = logging.getLogger("fastbus.client")

#: How soon the keeper looks again at a session whose lock it found taken
#: (by a native thread, which may not wake it when it lets go).
RETRY_TAKEN = 0.001


class Keeper(threading.Thread):
    """Serves the sessions of one client that no user thread (or event loop)
    drives at the moment."""

    def __init__(self, name: str) -> None:
        super().__init__(name=f"fastbus-keeper-{name}", daemon=True)
        self.client_name = name
        self.sessions: tuple[Session, ...] = ()       # replaced, never changed in place
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._signaled = False
        self._stopping = False
        self.stopped = threading.Event()

    # -- other threads ----------------------------------------------------------

    def add(self, session: Session) -> None:
        self.sessions = (*self.sessions, session)
        self.wake()

    def remove(self, session: Session) -> None:
        self.sessions = tuple(s for s in self.sessions if s is not session)

    @property
    def wake_fd(self) -> int:
        """A byte written here wakes the keeper (the native sender's way)."""
        return self._w

    def wake(self) -> None:
        """Have the keeper look at its sessions now (cheap when it already will)."""
        if self._signaled:
            return
        self._signaled = True
        try:
            os.write(self._w, b"\x00")
        except (BlockingIOError, OSError):
            pass      # the pipe is full (awake already) or closed (stopped)

    def stop(self, timeout: float) -> None:
        self._stopping = True
        self._signaled = False
        self.wake()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    # -- the thread -------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self._stopping:
                self._signaled = False
                try:
                    os.read(self._r, 4096)
                except (BlockingIOError, OSError):
                    pass
                timeout, watch = self._serve_all(time.monotonic())
                if self._stopping:
                    break
                p = select.poll()
                p.register(self._r, select.POLLIN)
                for fd in watch:
                    p.register(fd, select.POLLIN)
                p.poll(None if timeout is None else max(0, math.ceil(timeout * 1000)))
        except Exception:  # a bug: say so, the client's user threads still work
            log.exception("%s: the keeper thread failed", self.client_name)
        finally:
            self.stopped.set()

    def __del__(self) -> None:
        for fd in (getattr(self, "_r", -1), getattr(self, "_w", -1)):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _serve_all(self, now: float) -> tuple[float | None, list[int]]:
        """Serve every session nobody drives; return how long to sleep at
        most and the descriptors to watch meanwhile."""
        timeout: float | None = None      # (a session without a native reader pings on its due_in)
        watch = []
        for s in self.sessions:
            if s.closed or s.loop is not None:
                continue
            if s.drivers:
                # A user thread reads it now.  A session that must answer
                # the broker at once (WANT: ACK), or whose data is ours
                # (an inbox: a reply the native reader queued as that
                # thread let go), has us look again when it is done
                # (Session.keeper_may_look); a PubSub's reader reads on,
                # or we do at our next turn.
                s.keeper_skipped = s.acks or s.wake_on_data
                if s.drivers or not s.keeper_skipped:
                    continue
                # (It let go between our two looks, before it could see
                # the flag: serve it now.)
            # Said before we try: a thread that lets go of the lock after
            # our try sees it and wakes us.
            s.keeper_skipped = True
            with s.attempt() as held:
                if held:
                    s.keeper_skipped = False
                    s.serve(now)
            if not held:
                # A user thread holds it for a moment (an inline send, a
                # subscribe): it reads what arrived before it lets go, and
                # wakes us when it does.  So does the native sender; the
                # native reader (its read or ping, a moment too) does not:
                # look again soon.
                timeout = RETRY_TAKEN if timeout is None else min(timeout, RETRY_TAKEN)
                continue
            due = s.due_in(time.monotonic())
            if due is not None:
                timeout = due if timeout is None else min(timeout, due)
            if s.reading() and s.fd >= 0 and s.reader is None:    # (a native reader watches its own)
                watch.append(s.fd)
        return timeout, watch
