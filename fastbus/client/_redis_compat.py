"""redis-py's constructor and URLs for fastbus's clients, in one place.

``redis.Redis(...)`` and ``redis.Redis.from_url(url, ...)`` take some fifty
keywords; code written for them (a library that builds its client from an
app's ``redis_options``, say) passes them to fastbus's clients too.  Each
is either honoured, or accepted and said to have no effect on a broker,
or refused with an error that says why: never a ``TypeError`` for a name
redis-py knows.  ``REDIS_KEYWORDS`` is the table (the README's table of
differences follows it); ``from_url`` reads a URL as redis-py does.

The keywords fastbus's Client names itself (``host``, ``port``,
``decode_responses``, ``socket_timeout``, ``socket_connect_timeout``,
``health_check_interval``, ``client_name``, ``retry``, ``retry_on_timeout``,
``retry_on_error``, ``socket_keepalive``) are its own parameters; this
module handles the rest.
"""

from __future__ import annotations

import logging
from typing import Any, TypedDict
from urllib.parse import parse_qs, unquote, urlsplit

from fastbus.errors import InvalidURL

log = logging.getLogger("fastbus.client")

#: What each of redis-py's other keywords does here.  ``none``: accepted,
#: no effect on a broker (the note says why); ``honoured``: handled by
#: redis_options(); ``refused``: an error unless it has its default.
REDIS_KEYWORDS: dict[str, tuple[str, str]] = {
    "db": ("none", "pub/sub does not depend on the database, in Redis either: any db hears every channel"),
    "password": ("honoured", "not checked by a broker, which authenticates clients by CURVE key: a warning says so"),
    "username": ("honoured", "as password"),
    "credential_provider": ("honoured", "as password"),
    "unix_socket_path": ("honoured", "the broker's ipc:// endpoint at that path"),
    "encoding": ("honoured", "utf-8 only (what decode_responses decodes); another is a ValueError"),
    "encoding_errors": ("honoured", "strict only; another is a ValueError"),
    "max_connections": ("none", "a client has one connection for publishing and one per PubSub"),
    "single_connection_client": ("none", "as max_connections"),
    "connection_pool": ("refused", "a client makes its own connections: no pool (None only)"),
    "protocol": ("none", "the broker speaks fastbus's protocol; messages have redis-py's shape either way"),
    "socket_read_size": ("none", "the connection reads what the kernel has"),
    "socket_keepalive_options": ("none", "TCP keepalive is always on"),
    "ssl": ("refused", "the broker does not speak TLS: encrypt with CURVE (curve_server_key, ...)"),
    "ssl_keyfile": ("none", "without ssl"), "ssl_certfile": ("none", "without ssl"),
    "ssl_cert_reqs": ("none", "without ssl"), "ssl_include_verify_flags": ("none", "without ssl"),
    "ssl_exclude_verify_flags": ("none", "without ssl"), "ssl_ca_certs": ("none", "without ssl"),
    "ssl_ca_path": ("none", "without ssl"), "ssl_ca_data": ("none", "without ssl"),
    "ssl_check_hostname": ("none", "without ssl"), "ssl_password": ("none", "without ssl"),
    "ssl_validate_ocsp": ("none", "without ssl"), "ssl_validate_ocsp_stapled": ("none", "without ssl"),
    "ssl_ocsp_context": ("none", "without ssl"), "ssl_ocsp_expected_cert": ("none", "without ssl"),
    "ssl_min_version": ("none", "without ssl"), "ssl_ciphers": ("none", "without ssl"),
    "lib_name": ("none", "the broker sees the client's name (client_name)"),
    "lib_version": ("none", "as lib_name"), "driver_info": ("none", "as lib_name"),
    "redis_connect_func": ("refused", "a callback on each connection redis-py makes (None only)"),
    "legacy_responses": ("none", "responses are redis-py's pub/sub messages"),
    "cache": ("refused", "client-side caching is for keys; pub/sub has none (None only)"),
    "cache_config": ("refused", "as cache"),
    "event_dispatcher": ("none", "redis-py's internal events"),
    "maint_notifications_config": ("none", "Redis Enterprise maintenance notices"),
    "oss_cluster_maint_notifications_handler": ("none", "as maint_notifications_config"),
    "metadata_resolver": ("none", "redis-py's lookups of commands' metadata; fastbus's calls are its own"),
    "auto_close_connection_pool": ("none", "no pool (redis.asyncio)"),
}

_warned_password = False


class RedisKeywords(TypedDict, total=False):
    """The keywords of REDIS_KEYWORDS, for type checkers (a misspelt one is
    an error there, as at run time)."""

    db: Any
    password: Any
    username: Any
    credential_provider: Any
    unix_socket_path: Any
    encoding: Any
    encoding_errors: Any
    max_connections: Any
    single_connection_client: Any
    connection_pool: Any
    protocol: Any
    socket_read_size: Any
    socket_keepalive_options: Any
    ssl: Any
    ssl_keyfile: Any
    ssl_certfile: Any
    ssl_cert_reqs: Any
    ssl_include_verify_flags: Any
    ssl_exclude_verify_flags: Any
    ssl_ca_certs: Any
    ssl_ca_path: Any
    ssl_ca_data: Any
    ssl_check_hostname: Any
    ssl_password: Any
    ssl_validate_ocsp: Any
    ssl_validate_ocsp_stapled: Any
    ssl_ocsp_context: Any
    ssl_ocsp_expected_cert: Any
    ssl_min_version: Any
    ssl_ciphers: Any
    lib_name: Any
    lib_version: Any
    driver_info: Any
    redis_connect_func: Any
    legacy_responses: Any
    cache: Any
    cache_config: Any
    event_dispatcher: Any
    maint_notifications_config: Any
    oss_cluster_maint_notifications_handler: Any
    metadata_resolver: Any
    auto_close_connection_pool: Any


def redis_options(kwargs: dict[str, Any], owner: str = "Client") -> dict[str, Any]:
    """redis-py's other keywords given to ``owner``: checked against
    REDIS_KEYWORDS (a name it does not know is the TypeError Python would
    raise); returns what fastbus's Client takes from them (``endpoint``
    from unix_socket_path)."""
    global _warned_password
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        entry = REDIS_KEYWORDS.get(name)
        if entry is None:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        kind, why = entry
        if kind == "refused" and value not in (None, False):
            raise ValueError(f"{owner}({name}={value!r}): {why}")
        if name == "db" and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"db is a database number (an int >= 0), not {value!r}")
        if name in ("password", "username", "credential_provider") and value is not None \
                and not _warned_password:
            _warned_password = True
            log.warning("%s(%s=...): a fastbus broker checks no passwords; it authenticates clients by CURVE "
                        "key (curve_server_key, curve_public_key, curve_secret_key)", owner, name)
        elif name == "encoding" and str(value).lower().replace("_", "-") not in ("utf-8", "utf8"):
            raise ValueError(f"encoding={value!r}: fastbus decodes UTF-8 (decode_responses=True) or gives bytes")
        elif name == "encoding_errors" and value != "strict":
            raise ValueError(f"encoding_errors={value!r}: fastbus decodes strictly")
        elif name == "unix_socket_path" and value is not None:
            out["endpoint"] = f"ipc://{value}"
    return out


#: A URL's query arguments redis-py reads, and how (its URL_QUERY_ARGUMENT_PARSERS).
def _bool(v: str) -> bool:
    if v.lower() in ("", "0", "false", "f", "n", "no"):
        return False
    if v.lower() in ("1", "true", "t", "y", "yes"):
        return True
    raise ValueError(f"not a boolean: {v!r}")


_QUERY: dict[str, Any] = {
    "db": int, "health_check_interval": float, "max_connections": int, "protocol": int,
    "socket_connect_timeout": float, "socket_keepalive": _bool, "socket_timeout": float,
    "retry_on_timeout": _bool, "single_connection_client": _bool, "decode_responses": _bool,
    "client_name": str, "encoding": str, "encoding_errors": str, "ssl_cert_reqs": str,
}


def from_url(url: str) -> tuple[str, dict[str, Any]]:
    """A URL as redis-py's ``from_url`` reads it, for a fastbus broker: its
    endpoint and the keywords it carries.  ``redis://[[user]:password@]host
    [:port][/db][?option=value...]`` (port 6379 if none, as the scheme
    says), ``unix://[[user]:password@]/path[?db=N...]``, or one of fastbus's
    own endpoints (``tcp://``, ``ipc://``, ``inproc://``) as it is.
    ``rediss://`` is refused: the broker does not speak TLS."""
    if not isinstance(url, str):
        raise InvalidURL(f"a URL is a str, not {type(url).__name__}", repr(url))
    scheme = url.partition("://")[0].lower()
    if scheme in ("tcp", "ipc", "inproc"):
        return url, {}
    if scheme == "rediss":
        raise InvalidURL(f"{url!r}: a fastbus broker does not speak TLS (rediss://); encrypt with CURVE "
                         f"(curve_server_key, curve_public_key, curve_secret_key), or use redis:// on a "
                         f"trusted network", url)
    if scheme not in ("redis", "unix"):
        raise InvalidURL(f"{url!r}: not a URL fastbus reads (redis://host:port/db, unix:///path, or a fastbus "
                         f"endpoint: tcp://HOST:PORT, ipc://PATH, inproc://NAME)", url)
    parts = urlsplit(url)
    kw: dict[str, Any] = {}
    for name, values in parse_qs(parts.query, keep_blank_values=True).items():
        parse = _QUERY.get(name)
        if parse is None:
            raise InvalidURL(f"{url!r}: unknown option {name!r} (redis-py reads: {', '.join(sorted(_QUERY))})", url)
        try:
            kw[name] = parse(values[0])
        except ValueError as exc:
            raise InvalidURL(f"{url!r}: {name}={values[0]!r} is not valid ({exc})", url) from None
    if parts.username:
        kw.setdefault("username", unquote(parts.username))
    if parts.password:
        kw.setdefault("password", unquote(parts.password))
    if scheme == "unix":
        if not parts.path:
            raise InvalidURL(f"{url!r}: a unix:// URL names a socket's path (unix:///run/fastbus.sock)", url)
        return f"ipc://{unquote(parts.path)}", kw
    path = parts.path.lstrip("/")
    if path and "db" not in kw:
        try:
            kw["db"] = int(unquote(path))
        except ValueError:
            raise InvalidURL(f"{url!r}: the path is a database number (redis://host:port/0)", url) from None
    host = parts.hostname or "localhost"
    try:
        port = parts.port or 6379
    except ValueError:
        raise InvalidURL(f"{url!r}: the port is not a number", url) from None
    host = f"[{host}]" if ":" in host else host
    return f"tcp://{host}:{port}", kw
