"""CURVE keys from the files ``fastbus keygen`` writes.

    fastbus keygen --name server        # server.key (public), server.key_secret (mode 0600)
    fastbus keygen --name client
    fastbus broker --curve-cert server.key_secret --curve-allow client.key

    import fastbus, fastbus.curve
    client = fastbus.Client(**fastbus.curve.client_keys("server.key", "client.key_secret"))

The files are ZeroMQ certificates (``zmq.auth``); a key is 40 Z85
characters.  Errors are :class:`fastbus.errors.InvalidKey` (a ValueError).
"""

from __future__ import annotations

import os
from typing import TypedDict

from fastbus.errors import InvalidKey

__all__ = ["ClientKeys", "client_keys", "is_key", "load_certificate", "public_key"]


class ClientKeys(TypedDict):
    """What :func:`client_keys` returns: a CURVE client's keyword arguments
    (Z85 strings)."""
    curve_server_key: str
    curve_public_key: str
    curve_secret_key: str


def is_key(text: str) -> bool:
    """Is ``text`` a CURVE key (40 Z85 characters)?"""
    import zmq.utils.z85
    if not isinstance(text, str) or len(text) != 40:
        return False
    try:
        zmq.utils.z85.decode(text)
    except (ValueError, KeyError, TypeError):
        return False
    return True


def load_certificate(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """``(public, secret)`` Z85 keys of a certificate file (secret: None in
    a public ``.key`` file)."""
    import zmq.auth
    path = os.fspath(path)
    if not os.path.exists(path) and is_key(path):
        raise InvalidKey(f"{path!r} is a key, not a certificate file: give the file fastbus keygen wrote "
                         "(NAME.key_secret for this side's own keys, NAME.key for a peer's public key)")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise InvalidKey(f"cannot read CURVE certificate {path!r}: {exc}") from None
    return public.decode(), secret.decode() if secret else None


def public_key(key_or_file: str | os.PathLike[str]) -> str:
    """A peer's public key, given as the key itself or as a certificate file."""
    text = os.fspath(key_or_file)
    if is_key(text) and not os.path.exists(text):
        return text
    if os.path.isfile(text):
        return load_certificate(text)[0]
    raise InvalidKey(f"{text!r} is neither a CURVE key (40 Z85 characters) nor a certificate file")


def client_keys(server: str | os.PathLike[str], cert: str | os.PathLike[str]) -> ClientKeys:
    """The keyword arguments a CURVE client takes (``fastbus.Client``,
    ``fastbus.aio.Client``, ``fastbus.ShardedClient``): ``server`` is the
    broker's public key or its ``.key`` file, ``cert`` this client's
    ``.key_secret`` file."""
    public, secret = load_certificate(cert)
    if not secret:
        raise InvalidKey(f"{os.fspath(cert)!r} has no secret key (give the .key_secret file)")
    return {"curve_server_key": public_key(server), "curve_public_key": public, "curve_secret_key": secret}
