"""toolfleet's tools as `FunctionTool`s of the OpenAI Agents SDK
(`pip install openai-agents`).

```python
from agents import Agent, Runner
from toolfleet import AsyncClient
from toolfleet.adapters.openai_agents import function_tools

async with AsyncClient(url, token) as tf:
    agent = Agent(name="expenses", tools=await function_tools(tf))
    result = await Runner.run(agent, "How many lines has 2026-09?")
```

Each tool's invoke calls toolfleet and answers the envelope as JSON text; a
job is waited for (`wait_timeout_s`), so the model reads its outcome. The
schemas are toolfleet's own (optional fields stay optional), so the tools
are not in the SDK's strict mode.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Iterable

from .._client import AsyncClient, Client
from ._common import DEFAULT_WAIT_TIMEOUT_S, ToolSpec, arun_tool, run_tool, select

if TYPE_CHECKING:
    from agents import FunctionTool

__all__ = ["function_tools", "function_tool"]


def function_tool(
    client: AsyncClient | Client,
    spec: ToolSpec,
    *,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    run_id: str | None = None,
) -> FunctionTool:
    """One `FunctionTool` calling the toolfleet tool `spec` through `client`
    (a blocking `Client` is called from a thread)."""
    from agents import FunctionTool

    async def invoke(context: Any, arguments: str) -> str:
        if isinstance(client, AsyncClient):
            envelope = await arun_tool(client, spec.name, arguments, wait_timeout_s=wait_timeout_s, run_id=run_id)
        else:
            envelope = await asyncio.to_thread(
                run_tool, client, spec.name, arguments, wait_timeout_s=wait_timeout_s, run_id=run_id
            )
        return envelope.to_json()

    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=spec.input_schema,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )


async def function_tools(
    client: AsyncClient | Client,
    names: Iterable[str] | None = None,
    *,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    run_id: str | None = None,
) -> list[FunctionTool]:
    """The `FunctionTool`s of the tools the caller may call (`names`, in that
    order, or all of them), read from `GET /v1/tools`. `run_id` makes every
    call part of that toolfleet run."""
    if isinstance(client, AsyncClient):
        specs = await client.tools()
    else:
        specs = await asyncio.to_thread(client.tools)
    return [
        function_tool(client, spec, wait_timeout_s=wait_timeout_s, run_id=run_id)
        for spec in select(specs, names)
    ]
