"""An external Flask-SocketIO emitter: a plain script, no Flask app and no
server, that emits to the clients of every server on the message queue, as
Flask-SocketIO's docs ("Emitting from an External Process") show.  It knows
nothing of fastbus: it is given a redis:// URL and nothing else.

    python tests/apps/flask_socketio_emitter.py redis://127.0.0.1:6379/0 N

Emits "news" {"from": "external", "i": i, "via": "external"} for i in 0..N-1."""

import sys

from flask_socketio import SocketIO

url, n = sys.argv[1], int(sys.argv[2])

socketio = SocketIO(message_queue=url)
for i in range(n):
    socketio.emit("news", {"from": "external", "i": i, "via": "external"})
print("emitted", n, flush=True)
