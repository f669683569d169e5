"""The options of ``format("fastbus")``, parsed once with clear errors."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from fastbus.errors import OptionError
from fastbus.queue.names import DEFAULT_PREFIX, check_name
from fastbus.redis.server import ENV_URL, check_url, configured_url


KAFKA_SCHEMA = ("key binary, value binary, topic string, partition int, offset bigint, "
                "timestamp timestamp, timestampType int")
QUEUE_SCHEMA = KAFKA_SCHEMA + ", deliveries int"

_KNOWN = {
    "url", "prefix", "topic", "queue", "channel", "broker", "consumer", "list",
    "startingoffsets", "endingoffsets", "maxoffsetspertrigger", "minpartitions",
    "ttl", "maxdeliveries", "heartbeatttl", "writerid", "ignorekey",
    # Spark's own, passed through to the source and sink
    "checkpointlocation", "path",
}


@dataclass(frozen=True, slots=True)
class Options:
    url: str | None
    prefix: str
    topic: str | None
    queue: str | None
    channel: str | None
    broker: str | None
    consumer: str | None
    list: str | None
    starting: str | None
    ending: str | None
    max_per_trigger: int | None
    min_partitions: int
    ttl: float
    max_deliveries: int
    heartbeat_ttl: float
    writer_id: str | None
    ignore_key: bool

    def redis_url(self) -> str:
        """The Redis URL, or a clear error saying where one comes from."""
        if self.url is None:
            raise OptionError(
                "no Redis server: set option url (redis://host:port/db), or the environment "
                f"variable {ENV_URL} of the Spark processes, or register the source with "
                "fastbus.spark.register(spark, url) (with no url: the user's shared server, "
                "for local mode)")
        return self.url

    @property
    def kind(self) -> str:
        """What a sink writes to: "queue", "channel", or "topic" (the
        option, or each row's topic column)."""
        return "queue" if self.queue else "channel" if self.channel else "topic"


def _int(options: Mapping[str, str], name: str, default: int | None, low: int) -> int | None:
    v = options.get(name.lower())
    if v is None:
        return default
    try:
        n = int(v)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, not {v!r}") from None
    if n < low:
        raise OptionError(f"option {name} must be >= {low}, not {n}")
    return n


def _float(options: Mapping[str, str], name: str, default: float) -> float:
    v = options.get(name.lower())
    if v is None:
        return default
    try:
        x = float(v)
    except ValueError:
        raise OptionError(f"option {name} must be a number, not {v!r}") from None
    if not x > 0:
        raise OptionError(f"option {name} must be > 0, not {v}")
    return x


def _name(options: Mapping[str, str], name: str) -> str | None:
    v = options.get(name.lower())
    if v is None:
        return None
    try:
        return check_name(f"option {name}", v)
    except ValueError as e:
        raise OptionError(str(e)) from None


def _offset(options: Mapping[str, str], name: str) -> str | None:
    """earliest, latest, a message id, or None (the mode's default)."""
    v = options.get(name.lower())
    if v is None:
        return None
    v = v.strip().lower()
    if v in ("earliest", "latest"):
        return v
    try:
        if int(v) >= 1:
            return str(int(v))
    except ValueError:
        pass
    raise OptionError(f"option {name} must be earliest, latest or a message id >= 1, not {v!r}")


def parse(options: Mapping[str, str], default_url: str | None = None) -> Options:
    """``options`` as Spark passes them (keys lower-cased)."""
    opts = {k.lower(): v for k, v in options.items()}
    unknown = sorted(set(opts) - _KNOWN)
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(unknown)} for format('fastbus'); known: "
                          "url, prefix, topic, queue, channel, broker, consumer, list, startingOffsets, "
                          "endingOffsets, maxOffsetsPerTrigger, minPartitions, ttl, maxDeliveries, "
                          "heartbeatTtl, writerId, ignoreKey")
    targets = [k for k in ("topic", "queue", "channel") if opts.get(k)]
    if len(targets) > 1:
        raise OptionError(f"give one of the options topic, queue, channel, not {' and '.join(targets)}")
    lst = opts.get("list", "").lower() or None
    if lst not in (None, "failed", "ready", "retained"):
        raise OptionError(f"option list must be failed, ready or retained, not {lst!r}")
    ignore = (opts.get("ignorekey") or "false").lower()
    if ignore not in ("true", "false"):
        raise OptionError(f"option ignoreKey must be true or false, not {ignore!r}")
    prefix = opts.get("prefix") or DEFAULT_PREFIX
    url = opts.get("url") or None
    try:
        # fastbus's rule (fastbus.redis.resolve_url), but for its last step:
        # a worker never starts a server; register() resolved it in the driver.
        url = check_url(url, "option url") if url is not None else configured_url() or default_url
    except ValueError as e:
        raise OptionError(str(e)) from None
    return Options(
        url=url,
        prefix=prefix,
        topic=_name(opts, "topic"),
        queue=_name(opts, "queue"),
        channel=opts.get("channel") or None,
        broker=opts.get("broker") or None,
        consumer=_name(opts, "consumer"),
        list=lst,
        starting=_offset(opts, "startingOffsets"),
        ending=_offset(opts, "endingOffsets"),
        max_per_trigger=_int(opts, "maxOffsetsPerTrigger", None, 1),
        min_partitions=_int(opts, "minPartitions", 1, 1),
        ttl=_float(opts, "ttl", 86400.0),
        max_deliveries=_int(opts, "maxDeliveries", 10, 0),
        heartbeat_ttl=_float(opts, "heartbeatTtl", 15.0),
        writer_id=_writer_id(opts),
        ignore_key=ignore == "true",
    )


def _writer_id(opts: Mapping[str, str]) -> str | None:
    """The streaming sink's progress id: the option, else one derived from
    the query's checkpoint location (one query, one checkpoint)."""
    if opts.get("writerid"):
        return _name(opts, "writerId")
    ck = opts.get("checkpointlocation")
    if ck:
        return "ck-" + hashlib.sha1(ck.encode()).hexdigest()[:16]
    return None
