"""OpenTelemetry through message headers (fastbus.tracing): a publisher
process and a subscriber process, each with OpenTelemetry's SDK and an
in-memory exporter, and a real broker between them: one trace."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from brokers import python_process

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is in the test extra")

SETUP = """
import json, sys, time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
import fastbus, fastbus.tracing

def spans():
    return [{"name": s.name, "kind": s.kind.name, "trace": s.context.trace_id, "span": s.context.span_id,
             "parent": s.parent.span_id if s.parent else None, "attrs": dict(s.attributes)}
            for s in exporter.get_finished_spans()]
"""

SUBSCRIBER = SETUP + """
c = fastbus.Client(endpoint=sys.argv[1])
p = c.pubsub()
p.subscribe("orders")
assert p.get_message(timeout=5)["type"] == "subscribe"
print("ready", flush=True)
got = []
deadline = time.monotonic() + 20
while len(got) < 4 and time.monotonic() < deadline:
    m = p.get_message(timeout=0.5)
    if m is not None and m["type"] == "message":
        got.append(m)
        with trace.get_tracer("app").start_as_current_span("handle", context=fastbus.tracing.extract(m)):
            pass
c.close()
print(json.dumps({"headers": [sorted((m.get("headers") or {})) for m in got], "spans": spans()}), flush=True)
"""

PUBLISHER = SETUP + """
c = fastbus.Client(endpoint=sys.argv[1])
while not c.is_wanted("orders"):
    time.sleep(0.02)
with trace.get_tracer("app").start_as_current_span("checkout"):
    c.publish("orders", b"one", headers={"id": "1"})
c.publish_many([("orders", b"two"), ("orders", b"three", {"id": "3"})])
c.close()
import asyncio, fastbus.aio

async def main():
    async with fastbus.aio.Client(sys.argv[1]) as a:
        await a.publish("orders", b"four")

asyncio.run(main())
print(json.dumps({"spans": spans()}), flush=True)
"""


def test_one_trace_across_a_publisher_and_a_subscriber_process(brokers):
    b = brokers()
    sub = python_process(SUBSCRIBER, b.endpoint, stdout=subprocess.PIPE, text=True)
    try:
        assert sub.stdout.readline().strip() == "ready"
        pub = python_process(PUBLISHER, b.endpoint, stdout=subprocess.PIPE, text=True)
        out, _ = pub.communicate(timeout=60)
        assert pub.returncode == 0, out
        produced = json.loads(out.strip().splitlines()[-1])["spans"]
        out, _ = sub.communicate(timeout=60)
        assert sub.returncode == 0, out
    finally:
        for proc in (sub,):
            if proc.poll() is None:
                proc.kill()
    received = json.loads(out.strip().splitlines()[-1])
    sends = [s for s in produced if s["kind"] == "PRODUCER"]
    assert [s["name"] for s in sends] == ["send orders"] * 4          # (the last from the asyncio client)
    assert sends[0]["attrs"] == {"messaging.system": "fastbus", "messaging.destination.name": "orders",
                                 "messaging.operation.name": "send", "messaging.operation.type": "send",
                                 "messaging.message.body.size": 3}
    checkout = next(s for s in produced if s["name"] == "checkout")
    assert sends[0]["trace"] == checkout["trace"] and sends[0]["parent"] == checkout["span"]
    # Every message carries its span's context, beside the caller's headers.
    assert received["headers"] == [["id", "traceparent"], ["traceparent"], ["id", "traceparent"], ["traceparent"]]
    receives = [s for s in received["spans"] if s["kind"] == "CONSUMER"]
    handles = [s for s in received["spans"] if s["name"] == "handle"]
    assert [s["name"] for s in receives] == ["receive orders"] * 4
    for send, recv, handle in zip(sends, receives, handles):
        assert (recv["trace"], recv["parent"]) == (send["trace"], send["span"])      # one trace
        assert (handle["trace"], handle["parent"]) == (send["trace"], send["span"])
    assert receives[0]["attrs"]["messaging.operation.type"] == "receive"


def test_without_a_configured_provider_nothing_is_added(brokers):
    """OpenTelemetry installed but not configured (its no-op default): no
    span, no header; not installed: nothing of it is imported at all."""
    b = brokers()
    script = textwrap.dedent("""
        import importlib.util, json, sys, time
        hide = sys.argv[2] == "hide"
        if hide:                       # as if the package were not installed
            find = importlib.util.find_spec
            importlib.util.find_spec = lambda name, package=None: (
                None if name.split(".")[0] == "opentelemetry" else find(name, package))
        import fastbus
        c = fastbus.Client(endpoint=sys.argv[1])
        p = c.pubsub()
        p.subscribe("t")
        assert p.get_message(timeout=5)["type"] == "subscribe"
        while not c.is_wanted("t"):
            time.sleep(0.02)
        c.publish("t", b"x")
        m = p.get_message(timeout=5)
        c.close()
        print(json.dumps({"headers": m.get("headers"), "imported": "opentelemetry" in sys.modules,
                          "enabled": c._tracing is not None}))
    """)
    for mode, imported in (("hide", False), ("plain", True)):
        proc = python_process(script, b.endpoint, mode, stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert json.loads(out.strip().splitlines()[-1]) == {"headers": None, "imported": imported, "enabled": False}


REQUESTS = SETUP + """
import threading
c = fastbus.Client(endpoint=sys.argv[1])
ps = c.pubsub(ignore_subscribe_messages=True)
ps.subscribe("svc")
seen = []
def serve():
    for m in ps.listen():
        seen.append(m)
        with trace.get_tracer("app").start_as_current_span("answer", context=fastbus.tracing.extract(m)):
            m.respond(b"ok")
        return
threading.Thread(target=serve, daemon=True).start()
with trace.get_tracer("app").start_as_current_span("ask"):
    assert c.request("svc", b"q", timeout=10, headers={"id": "1"})["data"] == b"ok"
c.close()
print(json.dumps({"headers": sorted(seen[0]["headers"]), "spans": spans()}), flush=True)
"""


def test_a_request_is_traced_as_a_publish_is(brokers):
    """request() makes a PRODUCER span "send <channel>" under the caller's
    span and carries its context: the responder's work is in the same
    trace, a child of it."""
    b = brokers()
    p = python_process(REQUESTS, b.endpoint, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    got = json.loads(out.decode().strip().splitlines()[-1])
    assert got["headers"] == ["id", "traceparent"]
    spans = {s["name"]: s for s in got["spans"]}
    send, ask, answer = spans["send svc"], spans["ask"], spans["answer"]
    assert send["kind"] == "PRODUCER" and send["parent"] == ask["span"]
    assert answer["trace"] == ask["trace"] and answer["parent"] in (send["span"], spans["receive svc"]["span"])
