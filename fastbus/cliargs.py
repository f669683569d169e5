"""What the ``fastbus`` commands share about their arguments: argparse types
(:func:`positive`, :func:`port_number`, :func:`seconds`, :func:`nonnegative`), the Redis URL a
command uses (:func:`redis_url`) and the CURVE certificate files
(:func:`load_curve_keys`).  A malformed value is a
:class:`~fastbus.errors.UsageError` (exit 2) naming the option or variable."""

from __future__ import annotations

import argparse
import os

from fastbus.errors import InvalidKey, UsageError

__all__ = ["URL_HELP", "load_curve_keys", "nonnegative", "port_number", "positive", "redis_url", "seconds"]

#: What the queue, topic, inbox and monitor commands' Redis URL option says
#: of its default (redis_url).
URL_HELP = ("the Redis server (default $FASTBUS_REDIS_URL, else the user's shared server, where programs "
            "given no URL meet: see fastbus redis-server --help)")


def _number(text: str, cast, ok, what: str, out_of_range: str | None = None):
    """``text`` as ``cast`` gives it, if ``ok`` says so; else argparse's
    error: "must be ``what``" (or ``out_of_range``, for a number outside)."""
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, not {text}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {out_of_range or what}, not {text}")
    return value


def positive(text: str) -> int:
    """argparse type: an integer > 0."""
    return _number(text, int, lambda v: v > 0, "a positive integer")


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1 to 65535."""
    return _number(text, int, lambda v: 0 < v <= 65535, "a port number (1-65535)")


def seconds(text: str) -> float:
    """argparse type: a duration in seconds, over 0 and at most an hour."""
    return _number(text, float, lambda v: 0 < v <= 3600, "a number of seconds", "between 0 and 3600 seconds")


def nonnegative(text: str) -> float:
    """argparse type: a number >= 0."""
    return _number(text, float, lambda v: v >= 0, "a number >= 0", ">= 0")


def name_values(specs: list[str], sep: str, form: str) -> dict[str, str]:
    """Repeated NAME<sep>VALUE options (--resp-user USER:PASSWORD, pub's
    -H NAME=VALUE) as a dict; UsageError naming ``form`` for one that is
    not."""
    out = {}
    for spec in specs:
        name, found, value = spec.partition(sep)
        if not found or not name:
            raise UsageError(f"{form}, not {spec!r}")
        out[name] = value
    return out


def redis_url(given: str | None, option: str) -> str:
    """The Redis URL of a command, by the rule every part of fastbus follows
    (:func:`fastbus.redis.resolve_url`): ``given`` (the value of its option
    named ``option``, e.g. ``"--url"``), else ``$FASTBUS_REDIS_URL``, else
    the user's shared server, where programs given no URL meet too.
    UsageError naming the option or the variable if it is not a Redis URL."""
    from fastbus.redis.server import resolve_url
    try:
        return resolve_url(given, option)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def load_curve_keys(path: str) -> tuple[str, str | None]:
    """(public, secret) Z85 keys from a zmq certificate file (``fastbus
    keygen``); UsageError for a key given where the file was expected, or a
    file that holds no key."""
    from fastbus.curve import is_key, load_certificate
    if not os.path.exists(path) and is_key(path):
        raise UsageError(f"{path!r} is a key, not a certificate file: give the file fastbus keygen wrote "
                         "(NAME.key_secret for this side's own keys, NAME.key for a peer's public key)")
    try:
        return load_certificate(path)
    except InvalidKey as exc:                # a file named on the command line: a usage error
        raise UsageError(str(exc)) from None
