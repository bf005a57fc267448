"""When a request reached the server: the run info's ``queue`` stage, through public API only.

An ASGI middleware, given to the app's FastAPI through ``launch(app_kwargs=...)``, stamps every
HTTP request with its arrival time. An event function that takes a ``gr.Request`` gets the
request that queued the event (``/queue/join``, or ``/call/<api>`` for REST callers), so the
time from that stamp to the function's start is the wait in Gradio's queue plus Gradio's input
processing. Without the middleware (e.g. the app mounted elsewhere) there is no stamp and the run
info leaves the stage out.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.middleware import Middleware

ARRIVED = "sapiens2_arrived"


class StampArrival:
    """ASGI middleware: ``scope["state"][ARRIVED]`` = ``time.monotonic()`` when a request arrives."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            scope.setdefault("state", {})[ARRIVED] = time.monotonic()
        await self.app(scope, receive, send)


def app_kwargs() -> dict[str, Any]:
    """What ``Blocks.launch(app_kwargs=...)`` needs for the stamps (a fresh dict: Gradio adds to it)."""
    return {"middleware": [Middleware(StampArrival)]}


def waited(request: Any) -> float | None:
    """Seconds since the request that queued this event arrived, or None without a stamp."""
    raw = getattr(request, "request", None)  # gr.Request wraps the Starlette request
    state = getattr(raw, "scope", {}).get("state") if raw is not None else None
    arrived = state.get(ARRIVED) if isinstance(state, dict) else None
    return max(0.0, time.monotonic() - arrived) if isinstance(arrived, float) else None
