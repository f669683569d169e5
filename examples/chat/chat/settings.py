"""Settings of the chat example: no database, no sessions, no static files;
the channel layer is fastbus's, on the broker at $FASTBUS_ENDPOINT."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "chat-example-only-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

# "daphne" first makes `manage.py runserver` serve ASGI through daphne.
INSTALLED_APPS = ["daphne", "chat"]
ROOT_URLCONF = "chat.urls"
ASGI_APPLICATION = "chat.asgi.application"
DATABASES = {}
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]
USE_TZ = True

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "fastbus.channels.ChannelLayer",
        "CONFIG": {"endpoint": os.environ.get("FASTBUS_ENDPOINT", "tcp://127.0.0.1:6464")},
    },
}
