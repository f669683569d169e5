"""A python-socketio ASGI app sharing its clients with other server
processes through Redis pub/sub (socketio.AsyncRedisManager), served by
uvicorn, as python-socketio's docs show.  It knows nothing of fastbus: it
is given a redis:// URL ($REDIS_URL) and nothing else.

    REDIS_URL=redis://127.0.0.1:6379/0 SERVER_NAME=a \\
        python -m uvicorn --app-dir tests/apps socketio_asgi:app --port 8000

Events a client may send:
  "shout" {..}:          broadcast "news" {.., "via": this server} to every
                         client of every server;
  "tell"  {"to": sid, ..}: emit "private" {.., "via": this server} to one
                         client, wherever it is connected.
Both answer (ack) once the emit has been handed to Redis."""

import os

import socketio

NAME = os.environ.get("SERVER_NAME", "?")

sio = socketio.AsyncServer(async_mode="asgi",
                           client_manager=socketio.AsyncRedisManager(os.environ["REDIS_URL"]))
app = socketio.ASGIApp(sio)


@sio.event
async def shout(sid, data):
    await sio.emit("news", {**data, "via": NAME})
    return "ok"


@sio.event
async def tell(sid, data):
    await sio.emit("private", {**data, "via": NAME}, to=data["to"])
    return "ok"
