"""Reliable messaging on Redis: work queues, topics with logical consumers,
multi-recipient inboxes.  Every multi-key step is one Lua script; every key
of one queue, topic or inbox shares a hash tag (Redis Cluster)."""

from typing import TYPE_CHECKING

__all__ = [
    "AsyncConsumer",
    "AsyncInbox",
    "AsyncTopic",
    "AsyncWorkQueue",
    "CleanResult",
    "Consumer",
    "ConsumerGone",
    "ConsumerTagInUse",
    "Inbox",
    "InboxMessage",
    "Message",
    "PartialBatchError",
    "PastLastId",
    "PayloadTooLarge",
    "QueueError",
    "QueueName",
    "QueueStats",
    "SettleResult",
    "StagedWriter",
    "Topic",
    "TopicStats",
    "WorkQueue",
    "async_fetch_all_pending",
    "async_inboxes_of",
    "async_list_queues",
    "async_prune_queues",
    "fetch_all_pending",
    "inboxes_of",
    "list_queues",
    "prune_queues",
]

# The names above, imported on first use (fastbus._lazy says why).
if TYPE_CHECKING:
    from fastbus.errors import ConsumerGone, ConsumerTagInUse, PartialBatchError, PastLastId, PayloadTooLarge, QueueError
    from fastbus.queue.common import Message
    from fastbus.queue.inbox import (
        AsyncInbox,
        Inbox,
        InboxMessage,
        async_fetch_all_pending,
        async_inboxes_of,
        fetch_all_pending,
        inboxes_of,
    )
    from fastbus.queue.registry import (
        QueueName,
        async_list_queues,
        async_prune_queues,
        list_queues,
        prune_queues,
    )
    from fastbus.queue.staged import StagedWriter
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
else:
    from fastbus._lazy import attach

    __getattr__ = attach(__name__, __file__, globals())
