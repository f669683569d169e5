"""encode's broadcaster on Redis (``Broadcast("redis://...")``), as its
README shows.  It knows nothing of fastbus: it is given a redis:// URL and
nothing else.

    python tests/apps/broadcaster_app.py subscribe redis://127.0.0.1:6379 CHANNEL N
        prints "subscribed", then each message's text on a line as it
        arrives, and exits after N;
    python tests/apps/broadcaster_app.py publish redis://127.0.0.1:6379 CHANNEL N
        publishes "message 0" .. "message N-1" and prints "published N"."""

import asyncio
import sys

from broadcaster import Broadcast


async def subscribe(url: str, channel: str, n: int) -> None:
    async with Broadcast(url) as broadcast:
        async with broadcast.subscribe(channel=channel) as subscriber:
            print("subscribed", flush=True)
            got = 0
            async for event in subscriber:
                print(event.message, flush=True)
                got += 1
                if got == n:
                    break


async def publish(url: str, channel: str, n: int) -> None:
    async with Broadcast(url) as broadcast:
        for i in range(n):
            await broadcast.publish(channel=channel, message=f"message {i}")
    print("published", n, flush=True)


if __name__ == "__main__":
    mode, url, channel, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    asyncio.run({"subscribe": subscribe, "publish": publish}[mode](url, channel, n))
