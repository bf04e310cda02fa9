"""The input every benchmark uses: StartRequests encoded exactly as the SDK encodes them."""

from __future__ import annotations

from sluicegate.client.producer import Client
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.schemas import codec


def payload(i: int, note_bytes: int = 0) -> dict[str, object]:
    return {"orderId": f"order-{i:09d}", "customer": f"customer-{i % 977:05d}",
            "amount": (i * 37) % 100_000, "note": "x" * note_bytes}


class StartMaker:
    """Builds (key, value) pairs through the SDK's own request path (validation, ids,
    `requested_at_ms`, the key choice and the codec), without producing them."""

    def __init__(self, app: App, settings: Settings | None = None) -> None:
        # The SDK client without its reply reader and without connecting: only its
        # request builder is used.
        self._client = Client.__new__(Client)
        self._client.settings = settings or Settings()
        self._client.app = app
        self._client._replies = None

    def make(self, workflow: str, i: int, note_bytes: int = 0) -> tuple[bytes, bytes]:
        start, key = self._client._request(workflow, payload(i, note_bytes), None, None,
                                           "event", False)
        return key, codec.encode(start)


def make_starts(app: App, workflow: str, n: int, note_bytes: int = 0,
                first: int = 0) -> list[tuple[bytes, bytes]]:
    maker = StartMaker(app)
    return [maker.make(workflow, first + i, note_bytes) for i in range(n)]
