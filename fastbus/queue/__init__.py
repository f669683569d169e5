"""Reliable messaging on Redis: work queues, topics with logical consumers,
multi-recipient inboxes.  Every multi-key step is one Lua script; every key
of one queue, topic or inbox shares a hash tag (Redis Cluster)."""

from fastbus.queue._common import ConsumerTagInUse, Message, QueueError
from fastbus.queue.topic import AsyncTopic, Topic, TopicStats
from fastbus.queue.workqueue import (
    AsyncConsumer,
    AsyncWorkQueue,
    CleanResult,
    Consumer,
    QueueStats,
    SettleResult,
    WorkQueue,
)

__all__ = [
    "AsyncConsumer",
    "AsyncTopic",
    "AsyncWorkQueue",
    "CleanResult",
    "Consumer",
    "ConsumerTagInUse",
    "Message",
    "QueueError",
    "QueueStats",
    "SettleResult",
    "Topic",
    "TopicStats",
    "WorkQueue",
]
