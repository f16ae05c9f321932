"""`Client` and `AsyncClient`: one surface over the HTTP API of docs/API.md,
on httpx alone.

What raises and what answers:

- A tool call (`call`, `call_many`, `call_and_wait`) answers its envelope,
  `error` included: a tool's error is for the model to read. Only the
  request's own failure raises `ToolfleetError` (401 `unauthenticated`,
  400 `bad_request`, 413, 503 `unavailable`...).
- `get_job` and `wait_job` answer the job's envelope, its final `error`
  (with `state` `failed` or `cancelled`) included; an `error` about the
  request (`not_found`, `forbidden`) raises.
- Everything else (runs, tickets, the inbox, the job list, tools) answers
  the `result` of an `ok` envelope (or the route's JSON) and raises
  `ToolfleetError` for an `error` envelope, whatever its HTTP status.
  Runs, tickets and the pages are dicts typed as the `TypedDict`s `Run`,
  `RunPage`, `Ticket`, `TicketPage` and `JobPage` (`_types.py`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Iterable, Iterator, Literal, Mapping, Sequence, Union, cast

import httpx

from ._envelope import Envelope, ToolfleetConnectionError, ToolfleetError
from ._sse import SseEvent, SseParser
from ._types import JobPage, Run, RunPage, Ticket, TicketPage

__all__ = ["Client", "AsyncClient", "Call", "DEFAULT_URL", "MAX_WAIT_S", "ToolFormat"]

#: Where `toolfleet serve` listens by default.
DEFAULT_URL = "http://127.0.0.1:8080"
#: The longest `wait_s` of one long poll of `get_job`.
MAX_WAIT_S = 30
#: The run states after which a run's events stream ends.
RUN_SETTLED = ("answered", "failed", "budget_exceeded", "cancelled")

#: The formats of `GET /v1/tools` (any other string is sent as it is).
ToolFormat = Union[Literal["neutral", "openai", "openai-responses", "anthropic", "gemini", "mcp"], str]


@dataclass
class Call:
    """One call of a batch (`call_many`): the fields of `POST /v1/calls`."""

    tool: str
    args: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    run_id: str | None = None
    callback_url: str | None = None
    run_at: str | datetime | None = None
    delay_s: float | None = None
    priority: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _call_body(
            self.tool,
            self.args,
            idempotency_key=self.idempotency_key,
            run_id=self.run_id,
            callback_url=self.callback_url,
            run_at=self.run_at,
            delay_s=self.delay_s,
            priority=self.priority,
        )


def _call_body(
    tool: str,
    args: Mapping[str, Any] | None,
    *,
    idempotency_key: str | None = None,
    run_id: str | None = None,
    callback_url: str | None = None,
    run_at: str | datetime | None = None,
    delay_s: float | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"tool": tool, "args": dict(args or {})}
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    if run_id is not None:
        body["run_id"] = run_id
    if callback_url is not None:
        body["callback_url"] = callback_url
    if run_at is not None:
        if isinstance(run_at, datetime):
            if run_at.tzinfo is None:
                run_at = run_at.replace(tzinfo=timezone.utc)
            run_at = run_at.isoformat()
        body["run_at"] = run_at
    if delay_s is not None:
        body["delay_s"] = delay_s
    if priority is not None:
        body["priority"] = priority
    return body


def _batch_item(call: Call | Mapping[str, Any] | tuple[str, Mapping[str, Any]]) -> dict[str, Any]:
    if isinstance(call, Call):
        return call.to_json()
    if isinstance(call, tuple):
        tool, args = call
        return _call_body(tool, args)
    return dict(call)


@dataclass
class _Request:
    method: str
    path: str
    params: dict[str, Any] | None = None
    body: Any = None
    timeout: float | None = None

    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.params:
            kwargs["params"] = {k: v for k, v in self.params.items() if v is not None}
        if self.body is not None:
            kwargs["json"] = self.body
        if self.timeout is not None:
            kwargs["timeout"] = httpx.Timeout(10.0, read=self.timeout)
        return kwargs


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _check(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer; raises for any other status."""
    body = _body(response)
    if response.is_success:
        return body
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        error = ToolfleetError.from_envelope(body, status=response.status_code)
        if error.retry_after_s is None:
            error.retry_after_s = _retry_after(response)
        raise error
    raise ToolfleetError(
        "http_error",
        f"HTTP {response.status_code}: {response.text[:500]}",
        status=response.status_code,
        retry_after_s=_retry_after(response),
    )


def _envelope(response: httpx.Response) -> Envelope:
    body = _check(response)
    if not isinstance(body, Mapping) or "status" not in body:
        raise ToolfleetError("bad_answer", f"not an envelope: {str(body)[:500]}", status=response.status_code)
    return Envelope.from_json(body)


def _result(response: httpx.Response) -> Any:
    """The `result` of an `ok` envelope; raises for an `error` one."""
    body = _check(response)
    if isinstance(body, Mapping) and body.get("status") == "error":
        raise ToolfleetError.from_envelope(body, status=response.status_code)
    if isinstance(body, Mapping) and "status" in body and "result" in body:
        return body["result"]
    return body


def _job(response: httpx.Response) -> Envelope:
    """A job's envelope: its own final error is a value, an error about the
    request (no such job, a scope missing) raises."""
    envelope = _envelope(response)
    if envelope.is_error and envelope.state is None:
        raise ToolfleetError.from_envelope(envelope.raw, status=response.status_code)
    return envelope


def _calls(response: httpx.Response) -> list[Envelope]:
    body = _check(response)
    return [Envelope.from_json(e) for e in body["results"]]


def _not_a_stream(response: httpx.Response) -> bool:
    return not response.is_success or not response.headers.get("content-type", "").startswith("text/event-stream")


def _refused(response: httpx.Response) -> None:
    """Raises for the answer of a stream's route that is not a stream: an
    error status, or an `error` envelope (`not_found` of a run)."""
    _result(response)
    raise ToolfleetError("bad_answer", f"not an event stream: {response.text[:500]}", status=response.status_code)


def _transport_error(what: str, error: httpx.TransportError) -> ToolfleetConnectionError:
    """A transport failure as the client raises it: `timeout` when the
    answer (or a stream's next line) did not come in time, else
    `unavailable`."""
    code = "timeout" if isinstance(error, httpx.TimeoutException) else "unavailable"
    return ToolfleetConnectionError(code, f"{what}: {error or type(error).__name__}")


def _wait_s(wait_s: float | None) -> int | None:
    if wait_s is None:
        return None
    return max(0, min(MAX_WAIT_S, int(wait_s)))


def _states(states: str | Iterable[str] | None) -> str | None:
    if states is None or isinstance(states, str):
        return states
    return ",".join(states)


class _Requests:
    """The requests of every method, shared by both clients."""

    @staticmethod
    def tools(format: str) -> _Request:
        return _Request("GET", "/v1/tools", params={"format": format})

    @staticmethod
    def call(body: dict[str, Any]) -> _Request:
        return _Request("POST", "/v1/calls", body=body)

    @staticmethod
    def get_job(job_id: str, wait_s: float | None) -> _Request:
        wait = _wait_s(wait_s)
        return _Request(
            "GET",
            f"/v1/jobs/{job_id}",
            params={"wait_s": wait},
            timeout=(wait or 0) + 30.0,
        )

    @staticmethod
    def start_run(
        agent: str | None,
        input: str | None,
        checkpoint: Any,
        callback_url: str | None,
        idempotency_key: str | None,
    ) -> _Request:
        body: dict[str, Any] = {}
        if agent is not None:
            body["agent"] = agent
        if input is not None:
            body["input"] = input
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        if callback_url is not None:
            body["callback_url"] = callback_url
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return _Request("POST", "/v1/runs", body=body)

    @staticmethod
    def wait_run(
        run_id: str,
        jobs: Sequence[str],
        tickets: Sequence[str],
        for_: str,
        checkpoint: Any,
    ) -> _Request:
        body: dict[str, Any] = {"for": for_, "jobs": list(jobs), "tickets": list(tickets)}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        return _Request("POST", f"/v1/runs/{run_id}/wait", body=body)

    @staticmethod
    def answer_run(run_id: str, answer: str, checkpoint: Any) -> _Request:
        body: dict[str, Any] = {"answer": answer}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        return _Request("POST", f"/v1/runs/{run_id}/answer", body=body)

    @staticmethod
    def reject(ticket: str, reason: str | None) -> _Request:
        body: dict[str, Any] = {}
        if reason is not None:
            body["reason"] = reason
        return _Request("POST", f"/v1/tickets/{ticket}/reject", body=body)


def _headers(token: str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    out = {"Accept": "application/json", "User-Agent": "toolfleet-python/0.1.0"}
    if token:
        out["Authorization"] = f"Bearer {token}"
    out.update(headers or {})
    return out


class Client:
    """A blocking client of one toolfleet server, as one principal (its
    bearer token). Close it (or use it as a context manager) to free its
    connections. `http` is an `httpx.Client` of your own (a transport,
    proxies, TLS settings): it gets the server's root and the token, and
    closing this client closes it."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        if http is None:
            http = httpx.Client(timeout=timeout)
        # A client of the caller's (its transport, proxies, TLS) takes this
        # server's root and the token.
        http.base_url = httpx.URL(self.base_url)
        http.headers.update(_headers(token, headers))
        self._http = http

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, request: _Request) -> httpx.Response:
        try:
            return self._http.request(request.method, request.path, **request.kwargs())
        except httpx.TransportError as e:
            raise _transport_error(f"{request.method} {request.path}", e) from e

    # Tools and calls.

    def tools(self, format: ToolFormat = "neutral") -> Any:
        """`GET /v1/tools?format=F`: the specs the caller may call, in the form
        of `neutral`, `openai`, `openai-responses`, `anthropic`, `gemini` or
        `mcp`."""
        return _check(self._send(_Requests.tools(format)))

    def call(
        self,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        callback_url: str | None = None,
        run_at: str | datetime | None = None,
        delay_s: float | None = None,
        priority: int | None = None,
    ) -> Envelope:
        """Calls `tool`: its envelope, a tool's `error` included."""
        body = _call_body(
            tool,
            args,
            idempotency_key=idempotency_key,
            run_id=run_id,
            callback_url=callback_url,
            run_at=run_at,
            delay_s=delay_s,
            priority=priority,
        )
        return _envelope(self._send(_Requests.call(body)))

    def call_many(self, calls: Iterable[Call | Mapping[str, Any] | tuple[str, Mapping[str, Any]]]) -> list[Envelope]:
        """Makes every call in one request (1 to 1,000): an envelope each, in
        order. A call is a `Call`, a `(tool, args)` pair or a dict of the
        fields of `POST /v1/calls`."""
        body = {"calls": [_batch_item(c) for c in calls]}
        return _calls(self._send(_Requests.call(body)))

    def call_and_wait(self, tool: str, args: Mapping[str, Any] | None = None, *, timeout_s: float = 60.0, **fields: Any) -> Envelope:
        """Calls `tool` and, when it started a job, waits up to `timeout_s`
        for it to settle (`wait_job`)."""
        envelope = self.call(tool, args, **fields)
        if envelope.running and envelope.job_id:
            return self.wait_job(envelope.job_id, timeout_s)
        return envelope

    # Jobs.

    def get_job(self, job_id: str, wait_s: float | None = None) -> Envelope:
        """`get_job`: the job's envelope; with `wait_s` (0 to 30) waits up to
        that long for it to settle."""
        return _job(self._send(_Requests.get_job(job_id, wait_s)))

    def wait_job(self, job_id: str, timeout_s: float = 60.0) -> Envelope:
        """Long-polls `get_job` until the job settles or `timeout_s` passes:
        its envelope, still `running` when the time ran out."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            envelope = self.get_job(job_id, wait_s=max(0.0, min(MAX_WAIT_S, left)))
            if envelope.settled or deadline - time.monotonic() <= 0:
                return envelope
            if left < 1:
                time.sleep(max(0.0, min(0.2, deadline - time.monotonic())))

    def cancel_job(self, job_id: str) -> Envelope:
        """Cancels a job that has not settled: its envelope as it now stands."""
        return _job(self._send(_Request("POST", f"/v1/jobs/{job_id}/cancel")))

    def list_jobs(
        self,
        *,
        state: str | None = None,
        tool: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JobPage:
        """`GET /v1/jobs`: `{"jobs": [...], "next_cursor"}`, newest first."""
        request = _Request("GET", "/v1/jobs", params={"state": state, "tool": tool, "limit": limit, "cursor": cursor})
        return cast(JobPage, _result(self._send(request)))

    # Runs.

    def start_run(
        self,
        agent: str | None = None,
        input: str | None = None,
        *,
        checkpoint: Any = None,
        callback_url: str | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """`POST /v1/runs`: a run of the assistant `agent` on `input`, or (with
        `checkpoint` and no agent) a run the caller drives. Answers the run."""
        request = _Requests.start_run(agent, input, checkpoint, callback_url, idempotency_key)
        return cast(Run, _result(self._send(request)))

    def get_run(self, run_id: str) -> Run:
        """The run, its transcript included."""
        return cast(Run, _result(self._send(_Request("GET", f"/v1/runs/{run_id}"))))

    def list_runs(self, *, state: str | None = None, agent: str | None = None, cursor: str | None = None) -> RunPage:
        """`{"runs": [...], "next_cursor"}`, newest first, without transcripts."""
        request = _Request("GET", "/v1/runs", params={"state": state, "agent": agent, "cursor": cursor})
        return cast(RunPage, _result(self._send(request)))

    def follow_run(self, run_id: str, *, read_timeout_s: float | None = None) -> Iterator[SseEvent]:
        """The run's events (`run.<state>`, data the run without transcript
        and the `entries` it gained from `from`): first the run as it stands,
        then each change, until it answered or stopped."""
        return self._stream(f"/v1/runs/{run_id}/events", None, read_timeout_s)

    def wait_run_settled(self, run_id: str, timeout_s: float = 60.0) -> Run:
        """Follows the run's events until it is answered, failed, out of
        budget or cancelled (or `timeout_s` passes): the run as it then
        reads, transcript included."""
        deadline = time.monotonic() + timeout_s
        # The deadline is checked on every line, keep-alives included.
        events = self._stream(f"/v1/runs/{run_id}/events", None, timeout_s, deadline=deadline)
        try:
            for event in events:
                if event.json().get("state") in RUN_SETTLED:
                    break
        except ToolfleetConnectionError as e:
            if e.code != "timeout":
                raise
        finally:
            close = getattr(events, "close", None)
            if close:
                close()
        return self.get_run(run_id)

    def wait_run(
        self,
        run_id: str,
        *,
        jobs: Sequence[str] = (),
        tickets: Sequence[str] = (),
        for_: str = "all",
        checkpoint: Any = None,
    ) -> Run:
        """`POST /v1/runs/{run}/wait`: parks a run the caller drives on its
        jobs and tickets (`for_` `all` or `any`) with its checkpoint."""
        request = _Requests.wait_run(run_id, jobs, tickets, for_, checkpoint)
        return cast(Run, _result(self._send(request)))

    def message_run(self, run_id: str, content: str) -> Run:
        """The user's next message to an answered run of an assistant."""
        request = _Request("POST", f"/v1/runs/{run_id}/messages", body={"content": content})
        return cast(Run, _result(self._send(request)))

    def answer_run(self, run_id: str, answer: str, *, checkpoint: Any = None) -> Run:
        """Records the answer of a run the caller drives."""
        return cast(Run, _result(self._send(_Requests.answer_run(run_id, answer, checkpoint))))

    def cancel_run(self, run_id: str) -> Run:
        """Stops a run (and cancels the jobs it waits on)."""
        return cast(Run, _result(self._send(_Request("POST", f"/v1/runs/{run_id}/cancel"))))

    # The inbox.

    def inbox(self, *, state: str | None = None, kind: str | None = None, cursor: str | None = None) -> TicketPage:
        """`GET /v1/tickets`: `{"tickets": [...], "next_cursor"}`, the tickets
        the caller may answer, newest first."""
        request = _Request("GET", "/v1/tickets", params={"state": state, "kind": kind, "cursor": cursor})
        return cast(TicketPage, _result(self._send(request)))

    def get_ticket(self, ticket: str) -> Ticket:
        return cast(Ticket, _result(self._send(_Request("GET", f"/v1/tickets/{ticket}"))))

    def answer_ticket(self, ticket: str, answer: Any) -> Ticket:
        """Answers a question (one of its options, when it has some): the
        answered ticket. A second answer raises `conflict`."""
        request = _Request("POST", f"/v1/tickets/{ticket}/answer", body={"answer": answer})
        return cast(Ticket, _result(self._send(request)))

    def approve(self, ticket: str) -> Ticket:
        """Approves the commit an approval ticket holds: it runs once, now."""
        return cast(Ticket, _result(self._send(_Request("POST", f"/v1/tickets/{ticket}/approve", body={}))))

    def reject(self, ticket: str, reason: str | None = None) -> Ticket:
        """Rejects the commit an approval ticket holds."""
        return cast(Ticket, _result(self._send(_Requests.reject(ticket, reason))))

    # Events.

    def events(self, states: str | Iterable[str] | None = None, *, read_timeout_s: float | None = None) -> Iterator[SseEvent]:
        """`GET /v1/events`: the caller's jobs' and tickets' events as they
        come (`event` `job` or `ticket`, `id`, and `json()` the event with
        its `state` and `body`). The stream holds a connection until the
        iterator is closed (`close()`, or leaving a `with
        contextlib.closing(...)`); `read_timeout_s` bounds the wait for the
        next line (keep-alives count)."""
        return self._stream("/v1/events", {"state": _states(states)}, read_timeout_s)

    def _stream(
        self,
        path: str,
        params: dict[str, Any] | None,
        read_timeout_s: float | None,
        *,
        deadline: float | None = None,
    ) -> Iterator[SseEvent]:
        request = _Request("GET", path, params=params)
        kwargs = request.kwargs()
        kwargs["timeout"] = httpx.Timeout(10.0, read=read_timeout_s)
        kwargs["headers"] = {"Accept": "text/event-stream"}
        try:
            with self._http.stream("GET", path, **kwargs) as response:
                if _not_a_stream(response):
                    response.read()
                    _refused(response)
                parser = SseParser()
                for line in response.iter_lines():
                    if deadline is not None and time.monotonic() > deadline:
                        return
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TransportError as e:
            raise _transport_error(f"GET {path}", e) from e


class AsyncClient:
    """The asyncio twin of [`Client`]: the same methods, awaited; the
    streams (`events`, `follow_run`) are async iterators."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        if http is None:
            http = httpx.AsyncClient(timeout=timeout)
        # A client of the caller's (its transport, proxies, TLS) takes this
        # server's root and the token.
        http.base_url = httpx.URL(self.base_url)
        http.headers.update(_headers(token, headers))
        self._http = http

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, request: _Request) -> httpx.Response:
        try:
            return await self._http.request(request.method, request.path, **request.kwargs())
        except httpx.TransportError as e:
            raise _transport_error(f"{request.method} {request.path}", e) from e

    async def tools(self, format: ToolFormat = "neutral") -> Any:
        return _check(await self._send(_Requests.tools(format)))

    async def call(
        self,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        callback_url: str | None = None,
        run_at: str | datetime | None = None,
        delay_s: float | None = None,
        priority: int | None = None,
    ) -> Envelope:
        body = _call_body(
            tool,
            args,
            idempotency_key=idempotency_key,
            run_id=run_id,
            callback_url=callback_url,
            run_at=run_at,
            delay_s=delay_s,
            priority=priority,
        )
        return _envelope(await self._send(_Requests.call(body)))

    async def call_many(self, calls: Iterable[Call | Mapping[str, Any] | tuple[str, Mapping[str, Any]]]) -> list[Envelope]:
        body = {"calls": [_batch_item(c) for c in calls]}
        return _calls(await self._send(_Requests.call(body)))

    async def call_and_wait(self, tool: str, args: Mapping[str, Any] | None = None, *, timeout_s: float = 60.0, **fields: Any) -> Envelope:
        envelope = await self.call(tool, args, **fields)
        if envelope.running and envelope.job_id:
            return await self.wait_job(envelope.job_id, timeout_s)
        return envelope

    async def get_job(self, job_id: str, wait_s: float | None = None) -> Envelope:
        return _job(await self._send(_Requests.get_job(job_id, wait_s)))

    async def wait_job(self, job_id: str, timeout_s: float = 60.0) -> Envelope:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            envelope = await self.get_job(job_id, wait_s=max(0.0, min(MAX_WAIT_S, left)))
            if envelope.settled or deadline - time.monotonic() <= 0:
                return envelope
            if left < 1:
                await asyncio.sleep(max(0.0, min(0.2, deadline - time.monotonic())))

    async def cancel_job(self, job_id: str) -> Envelope:
        return _job(await self._send(_Request("POST", f"/v1/jobs/{job_id}/cancel")))

    async def list_jobs(
        self,
        *,
        state: str | None = None,
        tool: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JobPage:
        request = _Request("GET", "/v1/jobs", params={"state": state, "tool": tool, "limit": limit, "cursor": cursor})
        return cast(JobPage, _result(await self._send(request)))

    async def start_run(
        self,
        agent: str | None = None,
        input: str | None = None,
        *,
        checkpoint: Any = None,
        callback_url: str | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        request = _Requests.start_run(agent, input, checkpoint, callback_url, idempotency_key)
        return cast(Run, _result(await self._send(request)))

    async def get_run(self, run_id: str) -> Run:
        return cast(Run, _result(await self._send(_Request("GET", f"/v1/runs/{run_id}"))))

    async def list_runs(self, *, state: str | None = None, agent: str | None = None, cursor: str | None = None) -> RunPage:
        request = _Request("GET", "/v1/runs", params={"state": state, "agent": agent, "cursor": cursor})
        return cast(RunPage, _result(await self._send(request)))

    def follow_run(self, run_id: str, *, read_timeout_s: float | None = None) -> AsyncIterator[SseEvent]:
        return self._stream(f"/v1/runs/{run_id}/events", None, read_timeout_s)

    async def wait_run_settled(self, run_id: str, timeout_s: float = 60.0) -> Run:
        events = self.follow_run(run_id, read_timeout_s=timeout_s)

        async def settle() -> None:
            async for event in events:
                if event.json().get("state") in RUN_SETTLED:
                    return

        try:
            await asyncio.wait_for(settle(), timeout_s)
        except asyncio.TimeoutError:
            pass
        except ToolfleetConnectionError as e:
            if e.code != "timeout":
                raise
        finally:
            close = getattr(events, "aclose", None)
            if close:
                await close()
        return await self.get_run(run_id)

    async def wait_run(
        self,
        run_id: str,
        *,
        jobs: Sequence[str] = (),
        tickets: Sequence[str] = (),
        for_: str = "all",
        checkpoint: Any = None,
    ) -> Run:
        request = _Requests.wait_run(run_id, jobs, tickets, for_, checkpoint)
        return cast(Run, _result(await self._send(request)))

    async def message_run(self, run_id: str, content: str) -> Run:
        request = _Request("POST", f"/v1/runs/{run_id}/messages", body={"content": content})
        return cast(Run, _result(await self._send(request)))

    async def answer_run(self, run_id: str, answer: str, *, checkpoint: Any = None) -> Run:
        return cast(Run, _result(await self._send(_Requests.answer_run(run_id, answer, checkpoint))))

    async def cancel_run(self, run_id: str) -> Run:
        return cast(Run, _result(await self._send(_Request("POST", f"/v1/runs/{run_id}/cancel"))))

    async def inbox(self, *, state: str | None = None, kind: str | None = None, cursor: str | None = None) -> TicketPage:
        request = _Request("GET", "/v1/tickets", params={"state": state, "kind": kind, "cursor": cursor})
        return cast(TicketPage, _result(await self._send(request)))

    async def get_ticket(self, ticket: str) -> Ticket:
        return cast(Ticket, _result(await self._send(_Request("GET", f"/v1/tickets/{ticket}"))))

    async def answer_ticket(self, ticket: str, answer: Any) -> Ticket:
        request = _Request("POST", f"/v1/tickets/{ticket}/answer", body={"answer": answer})
        return cast(Ticket, _result(await self._send(request)))

    async def approve(self, ticket: str) -> Ticket:
        return cast(Ticket, _result(await self._send(_Request("POST", f"/v1/tickets/{ticket}/approve", body={}))))

    async def reject(self, ticket: str, reason: str | None = None) -> Ticket:
        return cast(Ticket, _result(await self._send(_Requests.reject(ticket, reason))))

    def events(self, states: str | Iterable[str] | None = None, *, read_timeout_s: float | None = None) -> AsyncIterator[SseEvent]:
        return self._stream("/v1/events", {"state": _states(states)}, read_timeout_s)

    async def _stream(self, path: str, params: dict[str, Any] | None, read_timeout_s: float | None) -> AsyncIterator[SseEvent]:
        request = _Request("GET", path, params=params)
        kwargs = request.kwargs()
        kwargs["timeout"] = httpx.Timeout(10.0, read=read_timeout_s)
        kwargs["headers"] = {"Accept": "text/event-stream"}
        try:
            async with self._http.stream("GET", path, **kwargs) as response:
                if _not_a_stream(response):
                    await response.aread()
                    _refused(response)
                parser = SseParser()
                async for line in response.aiter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TransportError as e:
            raise _transport_error(f"GET {path}", e) from e


def envelope_json(envelope: Envelope | Mapping[str, Any]) -> str:
    """An envelope as the JSON text a model reads."""
    if isinstance(envelope, Envelope):
        return envelope.to_json()
    return json.dumps(dict(envelope), ensure_ascii=False)
