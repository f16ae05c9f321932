"""The result envelope of docs/API.md and the error a request raises."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["Envelope", "ErrorInfo", "ToolfleetError", "ToolfleetConnectionError"]

#: The four statuses of an envelope.
STATUSES = ("ok", "error", "running", "suspended")


@dataclass(frozen=True)
class ErrorInfo:
    """The `error` object of an `error` envelope."""

    code: str
    message: str
    retryable: bool = False
    retry_after_s: float | None = None
    details: Any = None

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ErrorInfo:
        return cls(
            code=str(value.get("code", "")),
            message=str(value.get("message", "")),
            retryable=bool(value.get("retryable", False)),
            retry_after_s=value.get("retry_after_s"),
            details=value.get("details"),
        )


@dataclass(frozen=True)
class Envelope:
    """One tool call's (or `get_job`'s) answer: `ok`, `error`, `running` or
    `suspended`. A tool's error is a value, not an exception: a model reads
    it and acts on its message. `raw` is the JSON object as it came, with any
    field this class does not name."""

    status: str
    raw: dict[str, Any] = field(repr=False)
    result: Any = None
    call_id: str | None = None
    error: ErrorInfo | None = None
    job_id: str | None = None
    poll_after_s: float | None = None
    state: str | None = None
    attempts: int | None = None
    progress: Any = None
    run_at: str | None = None
    ticket: str | None = None
    question: str | None = None
    options: list[Any] | None = None

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Envelope:
        error = value.get("error")
        return cls(
            status=str(value.get("status", "")),
            raw=dict(value),
            result=value.get("result"),
            call_id=value.get("call_id"),
            error=ErrorInfo.from_json(error) if isinstance(error, Mapping) else None,
            job_id=value.get("job_id"),
            poll_after_s=value.get("poll_after_s"),
            state=value.get("state"),
            attempts=value.get("attempts"),
            progress=value.get("progress"),
            run_at=value.get("run_at"),
            ticket=value.get("ticket"),
            question=value.get("question"),
            options=value.get("options"),
        )

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_error(self) -> bool:
        return self.status == "error"

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def suspended(self) -> bool:
        return self.status == "suspended"

    @property
    def settled(self) -> bool:
        """Whether nothing more will come of it by waiting: not `running`."""
        return self.status != "running"

    def to_json(self) -> str:
        """The envelope as JSON text, the form to hand a model as a tool's
        result."""
        return json.dumps(self.raw, ensure_ascii=False)

    def raise_for_error(self) -> Envelope:
        """Raises a [`ToolfleetError`] for an `error` envelope; else answers
        the envelope itself."""
        if self.error is not None or self.status == "error":
            raise ToolfleetError.from_envelope(self.raw, status=200)
        return self


class ToolfleetError(Exception):
    """A request the API refused or could not answer: a transport status
    (401, 400, 429, 503...) or, on routes other than tool calls, an `error`
    envelope. `code` is the envelope's error code, `message` its message,
    `envelope` the whole JSON body when there was one, `status` the HTTP
    status of the answer (None when none came)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        envelope: dict[str, Any] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message
        self.status = status
        self.envelope = envelope
        self.retry_after_s = retry_after_s

    @property
    def error(self) -> ErrorInfo | None:
        """The envelope's `error` object, when the answer carried one."""
        if self.envelope and isinstance(self.envelope.get("error"), Mapping):
            return ErrorInfo.from_json(self.envelope["error"])
        return None

    @property
    def retryable(self) -> bool:
        info = self.error
        return info.retryable if info else self.code in ("rate_limited", "timeout", "unavailable")

    @classmethod
    def from_envelope(cls, envelope: Mapping[str, Any], *, status: int | None) -> ToolfleetError:
        error = envelope.get("error") if isinstance(envelope.get("error"), Mapping) else {}
        assert isinstance(error, Mapping)
        return cls(
            str(error.get("code", "error")),
            str(error.get("message", "")),
            status=status,
            envelope=dict(envelope),
            retry_after_s=error.get("retry_after_s"),
        )

    def __repr__(self) -> str:
        return f"ToolfleetError(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class ToolfleetConnectionError(ToolfleetError):
    """No answer came: the server could not be reached or the connection
    broke (code `unavailable`), or the answer or a stream's next line did
    not come within the timeout (code `timeout`). `status` is None; the
    original httpx error is `__cause__`."""
