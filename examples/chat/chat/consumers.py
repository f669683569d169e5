import json

from channels.generic.websocket import AsyncWebsocketConsumer


class ChatConsumer(AsyncWebsocketConsumer):
    """One per WebSocket: joins the room's group, sends every message it
    gets from its browser to the group, and every message of the group to
    its browser."""

    async def connect(self):
        self.group = "chat_" + self.scope["url_route"]["kwargs"]["room"]
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        try:
            data = json.loads(text_data or "")
            message = str(data["message"])[:1000]
        except (ValueError, TypeError, KeyError):      # not {"message": ...}: say so, keep the socket
            await self.send(text_data=json.dumps({"error": 'send JSON: {"name": ..., "message": ...}'}))
            return
        await self.channel_layer.group_send(self.group, {
            "type": "chat.message",          # handled by chat_message below
            "name": str(data.get("name", "anonymous"))[:40],
            "message": message,
        })

    async def chat_message(self, event):
        await self.send(text_data=json.dumps({"name": event["name"], "message": event["message"]}))
