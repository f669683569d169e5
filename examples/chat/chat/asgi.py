"""The ASGI application: Django for HTTP, ChatConsumer for WebSockets."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chat.settings")
http = get_asgi_application()          # sets Django up: import consumers after it

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import re_path  # noqa: E402

from chat.consumers import ChatConsumer  # noqa: E402
from chat.urls import ROOM  # noqa: E402

application = ProtocolTypeRouter({
    "http": http,
    "websocket": AllowedHostsOriginValidator(URLRouter([
        re_path(rf"^ws/chat/{ROOM}/$", ChatConsumer.as_asgi()),
    ])),
})
