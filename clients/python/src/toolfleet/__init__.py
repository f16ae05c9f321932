"""The Python client of toolfleet's HTTP API (docs/API.md).

```python
from toolfleet import Client

with Client("http://127.0.0.1:8080", token) as tf:
    envelope = tf.call("find_expenses", {"month": "2026-09"})
    if envelope.ok:
        print(envelope.result)
```

A tool's `error` envelope is a value (a model reads it); a request the API
refuses raises `ToolfleetError`. Runs, tickets and the lists are dicts
typed as `TypedDict`s (`Run`, `Ticket`, `RunPage`, `TicketPage`,
`JobPage`). Framework adapters live in
`toolfleet.adapters` and import their framework only when used.
"""

from ._client import DEFAULT_URL, MAX_WAIT_S, AsyncClient, Call, Client, ToolFormat, envelope_json
from ._envelope import Envelope, ErrorInfo, ToolfleetConnectionError, ToolfleetError
from ._sse import SseEvent, SseParser
from ._types import JobPage, JobSummary, Run, RunPage, RunWait, Ticket, TicketPage, TicketScope, TranscriptEntry
from .webhooks import DELIVERY_HEADER, SIGNATURE_HEADER, sign_webhook, verify_webhook

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Call",
    "Client",
    "DEFAULT_URL",
    "DELIVERY_HEADER",
    "Envelope",
    "ErrorInfo",
    "JobPage",
    "JobSummary",
    "MAX_WAIT_S",
    "Run",
    "RunPage",
    "RunWait",
    "SIGNATURE_HEADER",
    "SseEvent",
    "SseParser",
    "Ticket",
    "TicketPage",
    "TicketScope",
    "ToolfleetConnectionError",
    "ToolFormat",
    "ToolfleetError",
    "TranscriptEntry",
    "envelope_json",
    "sign_webhook",
    "verify_webhook",
]
