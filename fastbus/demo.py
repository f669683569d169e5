"""``fastbus demo``: a broker with live publishers and subscribers that
print their rates: the workload of the article "A Tale of Two Queues"
(ZeroMQ against Redis pub/sub; 50 channels "0".."49", 20-byte
messages, every subscriber on every channel), each client in its own process.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end_with(parent: int) -> None:
    """This process ends (SIGTERM) when the demo's process does, however it
    ends, kill -9 included: on Linux, the kernel's parent-death signal;
    and if the demo went before it could be asked, at once."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))    # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _publisher(endpoint: str, channels: int, size: int, stop, counts, index: int, parent: int) -> None:
    _end_with(parent)
    import fastbus
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    chans = [str(i).encode() for i in range(channels)]
    payload = b"x" * size
    client = fastbus.Client(endpoint=endpoint, name=f"demo-pub-{index}")
    n = 0
    publish = client.publish
    while not stop.is_set():
        for ch in chans:
            publish(ch, payload)
        n += len(chans)
        if n % 10000 == 0:
            counts[index] = n
    client.close()
    counts[index] = client.stats()["published"]


#: How long a subscriber waits, after the publishers are done, for what they
#: published (it stops as soon as it has it all).
DRAIN_S = 20.0


def _subscriber(endpoint: str, channels: int, ready, counts, index: int, published, parent: int) -> None:
    _end_with(parent)
    import fastbus
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    client = fastbus.Client(endpoint=endpoint, name=f"demo-sub-{index}")
    p = client.pubsub()
    p.subscribe(*[str(i) for i in range(channels)])
    confirmed = 0
    while confirmed < channels:
        m = p.get_message(timeout=5)
        if m is None:
            raise SystemExit("subscriber: no confirmation from the broker")
        confirmed += m["type"] == "subscribe"
    ready.set()
    n = 0
    deadline = None
    while True:
        n += len(p.get_batch(timeout=0.2))
        counts[index] = n
        if published.value >= 0:
            # The publishers are done (and said how many): drain what is
            # still in flight, every message, or until DRAIN_S says it is lost.
            if n >= published.value:
                break
            if deadline is None:
                deadline = time.monotonic() + DRAIN_S
            elif time.monotonic() > deadline:
                break
    client.close()


def run_demo(seconds: float, publishers: int, subscribers: int, channels: int, size: int, out) -> int:
    """Start a broker and the clients, print rates every second, then stop
    everything and print the totals.  Returns a process exit code."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    me = os.getpid()
    # Stopped by a signal (kill PID, a closed terminal), the demo stops as
    # at Ctrl-C: its children are stopped below; killed outright (-9),
    # each of them ends by itself (_end_with).
    previous = {sig: signal.signal(sig, _stop_by_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    # -P: "-m" would put the current directory first on sys.path, and from a
    # source checkout's root that imports the uncompiled tree, not the
    # installed package that runs this.
    broker = subprocess.Popen([sys.executable, "-P", "-m", "fastbus", "broker", "--bind", endpoint,
                               "--log-level", "WARNING"], preexec_fn=lambda: _end_with(me))
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = []
    try:
        _wait_for_broker(endpoint, broker)
        sub_counts = ctx.Array("q", subscribers)
        pub_counts = ctx.Array("q", publishers)
        published = ctx.Value("q", -1)        # all the publishers published, once they are done
        readies = []
        for i in range(subscribers):
            ready = ctx.Event()
            readies.append(ready)
            procs.append(ctx.Process(target=_subscriber,
                                     args=(endpoint, channels, ready, sub_counts, i, published, me)))
        for p in procs:
            p.start()
        for r in readies:
            if not r.wait(30):
                print("a subscriber did not start", file=sys.stderr)
                return 1
        for i in range(publishers):
            p = ctx.Process(target=_publisher, args=(endpoint, channels, size, stop, pub_counts, i, me))
            p.start()
            procs.append(p)
        print(f"broker on {endpoint}; {publishers} publisher(s) -> {subscribers} subscriber(s), "
              f"{channels} channels, {size}-byte messages", file=out)
        last_pub = last_sub = 0
        t_last = time.monotonic()
        end = t_last + seconds
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            now = time.monotonic()
            pub, sub = sum(pub_counts), sum(sub_counts)
            dt = now - t_last
            print(f"  published {(pub - last_pub) / dt:>12,.0f} msg/s   delivered {(sub - last_sub) / dt:>12,.0f} msg/s"
                  f"   ({(sub - last_sub) / dt / max(1, subscribers):,.0f} per subscriber)", file=out, flush=True)
            last_pub, last_sub, t_last = pub, sub, now
        stop.set()
        for p in procs[subscribers:]:          # the publishers first: then how many they published
            p.join(30)
        published.value = sum(pub_counts)
        for p in procs[:subscribers]:
            p.join(30 + DRAIN_S)
        pub, sub = sum(pub_counts), sum(sub_counts)
        expected = pub * subscribers
        print(f"total: published {pub:,}, delivered {sub:,} of {expected:,} expected"
              f" ({'no loss' if sub == expected else f'{expected - sub:,} missing'})", file=out)
        if sub != expected:
            _print_broker_drops(endpoint, out)
        return 0 if sub == expected else 1
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(10)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_by_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def _print_broker_drops(endpoint: str, out) -> None:
    """Where messages went missing, as far as the broker knows."""
    from fastbus.client import query_stats
    try:
        st = query_stats(endpoint, timeout=2)
    except TimeoutError:
        print("  the broker did not answer for its counters", file=out)
        return
    drops = {k: v for k, v in st.get("drops", {}).items() if v}
    print(f"  broker: drops {drops or 'none'}, flow pauses {st.get('flow_pauses', 0)}, "
          f"flow timeouts {st.get('flow_timeouts', 0)}", file=out)


def _wait_for_broker(endpoint: str, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    from fastbus.client import query_stats
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the broker exited with status {proc.returncode}")
        try:
            query_stats(endpoint, timeout=0.5)
            return
        except TimeoutError:                 # BrokerUnavailable at once while it starts: not a busy loop
            time.sleep(0.05)
    raise SystemExit(f"the broker did not answer on {endpoint}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo(5, 1, 2, 50, 20, sys.stdout))
