"""OpenTelemetry for fastbus's messages: trace context in their headers.

With the ``otel`` extra installed (``pip install "fastbus[otel]"``) and a
tracer provider configured (``opentelemetry.trace.set_tracer_provider``,
or the ``opentelemetry-instrument`` launcher) before a client is made:

* ``publish()`` and ``publish_many()`` of :class:`fastbus.Client` (and of
  its asyncio twin and the sharded client) make a PRODUCER span ``send
  <channel>`` per message and inject its context into the message's
  headers (W3C ``traceparent``/``tracestate``, or whatever propagator is
  configured), beside any headers the caller gave;
* a :class:`fastbus.PubSub` that receives a message with trace context
  makes a CONSUMER span ``receive <channel>`` in that trace, and
  :func:`extract` gives the context to parent the application's own work
  with: ``tracer.start_as_current_span("handle", context=extract(message))``.

Span names and attributes follow OpenTelemetry's messaging semantic
conventions (``messaging.system`` "fastbus", ``messaging.destination.name``,
``messaging.operation.type`` "send"/"receive", ``messaging.message.body.size``).

Without the extra nothing here is imported by fastbus and nothing is done:
this module looks for the package (``importlib.util.find_spec``) and
stops.  Installed but with no provider configured (OpenTelemetry's default
no-op), nothing is done either: a client costs nothing more per message.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["enabled", "extract", "tracer"]

#: messaging.system for fastbus's spans.
SYSTEM = "fastbus"


def tracer() -> Any | None:
    """fastbus's OpenTelemetry tracer, or None when the API is not installed
    or no tracer provider is configured (what a client decides with when it
    is made)."""
    if importlib.util.find_spec("opentelemetry") is None:
        return None
    from opentelemetry import trace
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    from fastbus import __version__
    return provider.get_tracer("fastbus", __version__)


def enabled() -> bool:
    """Would a client made now trace its messages?"""
    return tracer() is not None


class _Getter:
    """Header values for OpenTelemetry's propagators: str, bytes read as UTF-8."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        v = carrier.get(key)
        if v is None:
            return None
        return [v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)]

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return list(carrier)


_GETTER = _Getter()


def extract(message: Mapping[str, Any] | tuple) -> Any:
    """The OpenTelemetry context a message carries (a message dict, or a
    ``(channel, data, headers)`` tuple of ``get_batch()``): the parent for
    the span of its processing.  The current context when it carries none.
    Needs the ``otel`` extra."""
    from opentelemetry import context, propagate
    headers = message.get("headers") if isinstance(message, Mapping) else (message[2] if len(message) == 3 else None)
    if not headers:
        return context.get_current()
    return propagate.extract(headers, getter=_GETTER)


def _name(channel: Any) -> str:
    return channel.decode("utf-8", "replace") if isinstance(channel, (bytes, bytearray)) else str(channel)


def _attributes(name: str, data: Any, operation: str) -> dict[str, Any]:
    """A span's attributes by the messaging conventions."""
    attrs: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.destination.name": name,
                             "messaging.operation.name": operation, "messaging.operation.type": operation}
    if isinstance(data, (bytes, bytearray, str)):
        attrs["messaging.message.body.size"] = len(data)
    return attrs


class Producer:
    """A client's publish calls with a PRODUCER span each and its context
    injected into the message's headers."""

    def __init__(self, t: Any) -> None:
        from opentelemetry import propagate, trace
        self.tracer = t
        self.inject = propagate.inject
        self.kind = trace.SpanKind.PRODUCER

    def span(self, channel: Any, message: Any) -> Any:
        name = _name(channel)
        return self.tracer.start_as_current_span(f"send {name}", kind=self.kind,
                                                 attributes=_attributes(name, message, "send"))

    def headers(self, headers: Mapping[str, Any] | None) -> dict[str, Any]:
        """The headers to send: the caller's and the current context's."""
        out = dict(headers) if headers else {}
        self.inject(out)
        return out

    def wrap(self, publish: Callable[..., int]) -> Callable[..., int]:
        def traced_publish(channel: Any, message: Any, headers: Mapping[str, Any] | None = None) -> int:
            with self.span(channel, message):
                return publish(channel, message, self.headers(headers))
        traced_publish.__doc__ = publish.__doc__
        return traced_publish

    def items(self, messages: Iterable[tuple]) -> list[tuple]:
        """publish_many's items, each with its own span's context (the spans
        end as the items are made: a span per message, as publish makes)."""
        out = []
        for item in messages:
            channel, message = item[0], item[1]
            with self.span(channel, message):
                out.append((channel, message, self.headers(item[2] if len(item) == 3 else None)))
        return out


class Consumer:
    """A PubSub's CONSUMER span per received message that carries trace
    context, in the publisher's trace."""

    def __init__(self, t: Any) -> None:
        from opentelemetry import propagate, trace
        self.tracer = t
        self.extract = propagate.extract
        self.kind = trace.SpanKind.CONSUMER

    def received(self, channel: Any, data: Any, headers: Mapping[str, Any]) -> None:
        if not headers:
            return
        name = _name(channel)
        self.tracer.start_span(f"receive {name}", context=self.extract(headers, getter=_GETTER), kind=self.kind,
                               attributes=_attributes(name, data, "receive")).end()

    def dicts(self, messages: list) -> None:
        for m in messages:
            h = m.get("headers")
            if h:
                self.received(m["channel"], m["data"], h)

    def tuples(self, records: list) -> None:
        for r in records:
            if len(r) == 3:
                self.received(r[0], r[1], r[2])


def producer() -> Producer | None:
    """A Producer over fastbus's tracer, or None (see :func:`tracer`)."""
    t = tracer()
    return None if t is None else Producer(t)


def consumer() -> Consumer | None:
    """A Consumer over fastbus's tracer, or None (see :func:`tracer`)."""
    t = tracer()
    return None if t is None else Consumer(t)
