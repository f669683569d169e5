"""A Flask-SocketIO server sharing its clients with other server processes
and with external emitters through Redis (``message_queue=``), as
Flask-SocketIO's docs show.  It knows nothing of fastbus: it is given a
redis:// URL and nothing else.

    python tests/apps/flask_socketio_app.py redis://127.0.0.1:6379/0 PORT NAME

Events a client may send: "shout" {..} broadcasts "news" {.., "via": NAME}
to every client of every server, and answers (ack) once it is queued."""

import sys

from flask import Flask
from flask_socketio import SocketIO, emit

url, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]

app = Flask(__name__)
socketio = SocketIO(app, message_queue=url, async_mode="threading")


@socketio.on("shout")
def shout(data):
    emit("news", {**data, "via": name}, broadcast=True)
    return "ok"


if __name__ == "__main__":
    # Werkzeug's server (threading mode; simple-websocket for WebSocket):
    # a test's server, not a production one.
    socketio.run(app, host="127.0.0.1", port=port, allow_unsafe_werkzeug=True, log_output=False)
