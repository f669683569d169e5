"""The exception a queue operation raises for a failure of its requests:
the Lua scripts' own refusals (``FBQ ...``) as :class:`QueueError` /
:class:`ConsumerTagInUse`, a value over the server's ``proto-max-bulk-len``
as :class:`PayloadTooLarge`, and everything else through
:func:`fastbus.redis.errors.translate`, the one mechanism every Redis part
uses, naming the operation, the queue and the server.  Both drivers
(:mod:`fastbus.queue.driver`) raise through here.
"""

from __future__ import annotations

import re
from typing import Any

import redis

from fastbus.errors import ConsumerTagInUse, QueueError
from fastbus.queue.common import Call, Cmd, Many, Register
from fastbus.redis.errors import MIN_MAX_BULK_LEN, PayloadTooLarge, address_of, too_large


def queue_failure(error: BaseException, client: Any = None, request: Any = None, limit: int | None = None) -> BaseException:
    """The exception a queue operation raises for ``error``, a failure of
    ``request`` on ``client``: the scripts' own refusals (``FBQ ...``) as
    :class:`QueueError` / :class:`ConsumerTagInUse`; everything else (network,
    timeouts, a peer that is not Redis, OOM, sizes) through
    :func:`fastbus.redis.errors.translate`, the one mechanism every Redis
    part uses, naming the operation, the queue and the server.  ``limit``:
    the server's ``proto-max-bulk-len``, when the caller read it because a
    large value was refused."""
    from fastbus.redis.errors import clean_reply, is_connection_failure, largest, translate
    text = str(error)
    if isinstance(error, redis.ResponseError) and text.startswith("FBQ "):
        text = text[4:].split(" script:")[0]
        kind, _, rest = text.partition(" ")
        if kind == "TAKEN":
            return ConsumerTagInUse(rest)
        return QueueError(rest)
    # What was being done: "PUT on queue 'jobs'", "BLPOP on topic 'ev'".
    operation = None
    values: list = []
    if request is not None:
        calls = request.calls if isinstance(request, Many) else [request]
        first = calls[0] if calls else None
        if isinstance(first, Call):
            verb, key = first.script, first.key
        elif isinstance(first, Register):        # the registry of names: "q:jobs"
            verb, key = "registering", f":{first.member[0]}:{{{first.member[2:]}}}"
        elif isinstance(first, Cmd) and first.args:
            verb, key = str(first.args[0]).upper(), (first.args[1] if len(first.args) > 1 else "")
        else:
            verb, key = None, ""
        if verb is not None:
            if isinstance(key, bytes):
                key = key.decode("utf-8", "replace")
            m = re.search(r":([qticu]):\{([^}]*)\}", str(key))
            kinds = {"q": "queue", "t": "topic", "i": "inbox", "c": "channel", "u": "member"}
            operation = f"{verb} on {kinds[m.group(1)]} {m.group(2)!r}" if m else verb
            if len(calls) > 1:
                operation += f" and {len(calls) - 1} more call{'s' if len(calls) > 2 else ''}"
        for c in calls:
            values.extend(c.args if isinstance(c, (Call, Cmd)) else ())
    address = address_of(client)
    if isinstance(error, redis.ResponseError) and text.startswith("WRONGTYPE"):
        return QueueError(f"a key of this queue holds a value of another type (not made by fastbus?)"
                          f"{f' ({operation})' if operation else ''} at {address}: {clean_reply(text)}")
    # A value over the server's proto-max-bulk-len: Redis answers "invalid
    # bulk length" and closes the connection, or the connection just breaks
    # (a broken pipe) while the value is being written.  Without ``limit``
    # a large value is the suspect (a PayloadTooLarge without a limit: the
    # caller reads the server's limit and calls again with it).
    if is_connection_failure(error) or "bulk length" in text.lower():
        size = largest(values)
        if size > MIN_MAX_BULK_LEN and (limit is None or size > limit):
            return too_large(size, limit, address, operation, original=error)
    return translate(error, address, operation)


def with_address(error: BaseException, client: Any) -> BaseException:
    """A size refusal an operation raised before sending (SizeCheck) knows
    no server: name the client's."""
    if isinstance(error, PayloadTooLarge) and error.address is None:
        return too_large(error.size or 0, error.limit, address_of(client), error.operation)
    return error
