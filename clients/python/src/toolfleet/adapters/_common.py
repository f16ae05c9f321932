"""What every adapter shares: the tool specs, one call made and waited for."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .._client import AsyncClient, Client
from .._envelope import Envelope

#: How long an adapter waits for a job before answering its `running`
#: envelope to the model.
DEFAULT_WAIT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ToolSpec:
    """A tool as `GET /v1/tools?format=neutral` describes it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    shape: str = "query"
    title: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, spec: Mapping[str, Any]) -> ToolSpec:
        return cls(
            name=spec["name"],
            description=spec.get("description") or spec.get("title") or spec["name"],
            input_schema=dict(spec.get("input_schema") or {"type": "object", "properties": {}}),
            shape=spec.get("shape", "query"),
            title=spec.get("title"),
            raw=dict(spec),
        )


def select(specs: Iterable[Mapping[str, Any]], names: Iterable[str] | None) -> list[ToolSpec]:
    """The specs of `names` (in their order; every tool when None). A name
    the server does not list raises KeyError."""
    by_name = {s["name"]: ToolSpec.from_json(s) for s in specs}
    if names is None:
        return list(by_name.values())
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"toolfleet lists no tool {missing} for this caller; it lists {sorted(by_name)}")
    return [by_name[n] for n in names]


def bad_arguments(tool: str, reason: str) -> Envelope:
    """The `invalid_arguments` envelope of arguments that are not a JSON
    object: what the model reads, as toolfleet would have said it."""
    return Envelope.from_json(
        {
            "status": "error",
            "error": {
                "code": "invalid_arguments",
                "message": f"the arguments of `{tool}` are not a JSON object ({reason}); send them as one and call again.",
                "retryable": False,
            },
        }
    )


def parse_arguments(tool: str, arguments: str | Mapping[str, Any] | None) -> dict[str, Any] | Envelope:
    """A model's arguments as a dict, or the error envelope to answer it
    with when they are not a JSON object."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        value = json.loads(arguments)
    except ValueError as e:
        return bad_arguments(tool, str(e))
    if not isinstance(value, dict):
        return bad_arguments(tool, f"got {type(value).__name__}")
    return value


def run_tool(
    client: Client,
    tool: str,
    arguments: str | Mapping[str, Any] | None,
    *,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    run_id: str | None = None,
) -> Envelope:
    """Calls `tool` with a model's `arguments` (JSON text or a dict) and
    waits for its job: the envelope the model should read."""
    args = parse_arguments(tool, arguments)
    if isinstance(args, Envelope):
        return args
    return client.call_and_wait(tool, args, timeout_s=wait_timeout_s, run_id=run_id)


async def arun_tool(
    client: AsyncClient,
    tool: str,
    arguments: str | Mapping[str, Any] | None,
    *,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    run_id: str | None = None,
) -> Envelope:
    """The asyncio twin of [`run_tool`]."""
    args = parse_arguments(tool, arguments)
    if isinstance(args, Envelope):
        return args
    return await client.call_and_wait(tool, args, timeout_s=wait_timeout_s, run_id=run_id)
