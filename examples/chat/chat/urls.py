from django.shortcuts import redirect, render
from django.urls import path, re_path

# Room names end up in channel layer group names: ASCII letters, digits,
# "-" and "_", and short.
ROOM = r"(?P<room>[A-Za-z0-9_-]{1,50})"


def room(request, room):
    return render(request, "chat/room.html", {"room": room})


urlpatterns = [
    path("", lambda request: redirect("/chat/lobby/")),
    re_path(rf"^chat/{ROOM}/$", room),
]
