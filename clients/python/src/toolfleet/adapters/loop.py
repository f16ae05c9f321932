"""A plain tool loop, for the OpenAI Chat Completions and Anthropic
Messages wire formats, with no framework and no MCP.

Give the model `client.tools("openai")` (or `"anthropic"`); when its reply
calls tools, pass the calls here: they go to toolfleet in one request
(`POST /v1/calls` with `{"calls": [...]}`), the jobs they started are waited
for, and you get the messages to append to the conversation:

```python
reply = chat(messages, tools=tf.tools("openai"))["choices"][0]["message"]
messages.append(reply)
messages += openai_tool_messages(tf, reply.get("tool_calls") or [])
```

```python
reply = anthropic_messages(messages, tools=tf.tools("anthropic"))
messages.append({"role": "assistant", "content": reply["content"]})
messages.append(anthropic_tool_results(tf, reply["content"]))
```

Each result is the envelope as JSON text. An `error` envelope is marked
`is_error` for Anthropic; a call whose arguments are not a JSON object is
answered without reaching toolfleet. The SDKs' objects (the `openai` and
`anthropic` packages) are taken as well as plain dicts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .._client import AsyncClient, Client
from .._envelope import Envelope
from ._common import DEFAULT_WAIT_TIMEOUT_S, parse_arguments

__all__ = [
    "ToolCall",
    "anthropic_tool_results",
    "anthropic_tool_uses",
    "aanthropic_tool_results",
    "aopenai_tool_messages",
    "openai_tool_calls",
    "openai_tool_messages",
    "run_calls",
    "arun_calls",
]


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a model's reply, in neither wire format: its id,
    tool name and arguments (JSON text or a dict)."""

    id: str
    name: str
    arguments: str | Mapping[str, Any] | None


def _plain(value: Any) -> Any:
    """A dict of an SDK object (pydantic's `model_dump`), or the value."""
    dump = getattr(value, "model_dump", None)
    return dump() if callable(dump) else value


def openai_tool_calls(tool_calls: Iterable[Any]) -> list[ToolCall]:
    """The `tool_calls` of a Chat Completions assistant message."""
    calls = []
    for call in tool_calls:
        call = _plain(call)
        function = call.get("function") or {}
        calls.append(ToolCall(id=call["id"], name=function.get("name", ""), arguments=function.get("arguments")))
    return calls


def anthropic_tool_uses(content: Iterable[Any]) -> list[ToolCall]:
    """The `tool_use` blocks of an Anthropic Messages reply's `content`."""
    calls = []
    for block in content:
        block = _plain(block)
        if block.get("type") == "tool_use":
            calls.append(ToolCall(id=block["id"], name=block["name"], arguments=block.get("input") or {}))
    return calls


def _split(
    calls: Iterable[ToolCall], run_id: str | None
) -> tuple[list[Envelope | None], list[tuple[int, dict[str, Any]]]]:
    """A place per call, filled with the error envelope of a call whose
    arguments do not parse, and the batch of the others (their places and
    call bodies)."""
    calls = list(calls)
    envelopes: list[Envelope | None] = [None] * len(calls)
    batch: list[tuple[int, dict[str, Any]]] = []
    for i, call in enumerate(calls):
        args = parse_arguments(call.name, call.arguments)
        if isinstance(args, Envelope):
            envelopes[i] = args
        else:
            body: dict[str, Any] = {"tool": call.name, "args": args}
            if run_id is not None:
                body["run_id"] = run_id
            batch.append((i, body))
    return envelopes, batch


def run_calls(client: Client, calls: Iterable[ToolCall], *, wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S, run_id: str | None = None) -> list[Envelope]:
    """Makes `calls` in one request and waits for the jobs they started (up
    to `wait_timeout_s` in all): an envelope per call, in order."""
    envelopes, batch = _split(calls, run_id)
    if batch:
        for (i, _), envelope in zip(batch, client.call_many([b for _, b in batch])):
            if envelope.running and envelope.job_id:
                envelope = client.wait_job(envelope.job_id, wait_timeout_s)
            envelopes[i] = envelope
    return [e for e in envelopes if e is not None]


async def arun_calls(
    client: AsyncClient, calls: Iterable[ToolCall], *, wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S, run_id: str | None = None
) -> list[Envelope]:
    """The asyncio twin of [`run_calls`]; the jobs are waited for together."""
    envelopes, batch = _split(calls, run_id)
    if batch:
        answered = await client.call_many([b for _, b in batch])

        async def settle(envelope: Envelope) -> Envelope:
            if envelope.running and envelope.job_id:
                return await client.wait_job(envelope.job_id, wait_timeout_s)
            return envelope

        settled = await asyncio.gather(*(settle(e) for e in answered))
        for (i, _), envelope in zip(batch, settled):
            envelopes[i] = envelope
    return [e for e in envelopes if e is not None]


def _openai_messages(calls: list[ToolCall], envelopes: list[Envelope]) -> list[dict[str, Any]]:
    return [
        {"role": "tool", "tool_call_id": call.id, "content": envelope.to_json()}
        for call, envelope in zip(calls, envelopes)
    ]


def _anthropic_message(calls: list[ToolCall], envelopes: list[Envelope]) -> dict[str, Any]:
    blocks = []
    for call, envelope in zip(calls, envelopes):
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call.id, "content": envelope.to_json()}
        if envelope.is_error:
            block["is_error"] = True
        blocks.append(block)
    return {"role": "user", "content": blocks}


def openai_tool_messages(
    client: Client, tool_calls: Iterable[Any], *, wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S, run_id: str | None = None
) -> list[dict[str, Any]]:
    """Runs a Chat Completions reply's `tool_calls` through toolfleet: the
    `{"role": "tool", "tool_call_id", "content"}` messages, in order."""
    calls = openai_tool_calls(tool_calls)
    return _openai_messages(calls, run_calls(client, calls, wait_timeout_s=wait_timeout_s, run_id=run_id))


async def aopenai_tool_messages(
    client: AsyncClient, tool_calls: Iterable[Any], *, wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S, run_id: str | None = None
) -> list[dict[str, Any]]:
    """The asyncio twin of [`openai_tool_messages`]."""
    calls = openai_tool_calls(tool_calls)
    return _openai_messages(calls, await arun_calls(client, calls, wait_timeout_s=wait_timeout_s, run_id=run_id))


def anthropic_tool_results(
    client: Client, content: Iterable[Any], *, wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S, run_id: str | None = None
) -> dict[str, Any]:
    """Runs an Anthropic reply's `tool_use` blocks through toolfleet: the
    user message of their `tool_result` blocks, in order."""
    calls = anthropic_tool_uses(content)
    return _anthropic_message(calls, run_calls(client, calls, wait_timeout_s=wait_timeout_s, run_id=run_id))


async def aanthropic_tool_results(
    client: AsyncClient, content: Iterable[Any], *, wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S, run_id: str | None = None
) -> dict[str, Any]:
    """The asyncio twin of [`anthropic_tool_results`]."""
    calls = anthropic_tool_uses(content)
    return _anthropic_message(calls, await arun_calls(client, calls, wait_timeout_s=wait_timeout_s, run_id=run_id))
