"""Client internals that need no broker."""

import threading
import time

import fastbus
from brokers import free_port


def test_get_batch_returns_while_batches_keep_arriving():
    """A sender as fast as the reader must not keep get_batch() from
    returning (it once looped while the inbox was non-empty)."""
    c = fastbus.Client(endpoint=f"tcp://127.0.0.1:{free_port()}", max_inbox_bytes=4 << 20)
    p = c.pubsub()
    batch = bytes(fastbus.encode([(b"t", b"x" * 20)] * 1000))
    stop = threading.Event()

    def flood():
        # Like the I/O thread: refill as fast as possible, pausing while the
        # inbox is full, resuming when the reader has taken half.
        while not stop.is_set():
            if p._conn.paused:
                time.sleep(0.0001)
                continue
            for _ in range(200):
                if not p._deliver(("data", 0, batch)):
                    break

    t = threading.Thread(target=flood)
    t.start()
    try:
        time.sleep(0.05)
        for _ in range(20):
            result = []
            reader = threading.Thread(target=lambda: result.append(p.get_batch(timeout=1)), daemon=True)
            reader.start()
            reader.join(3)                       # a stuck call fails the test instead of hanging it
            assert not reader.is_alive(), "get_batch did not return while batches kept arriving"
            assert result and result[0]
    finally:
        stop.set()
        t.join()
        c.close(timeout=0.2)
