"""toolfleet's tools as LangChain `StructuredTool`s (`pip install
langchain-core`).

```python
from toolfleet import Client
from toolfleet.adapters.langchain import structured_tools

tools = structured_tools(Client(url, token))
tools[0].invoke({"month": "2026-09"})      # the envelope, as JSON text
```

Each tool's arguments schema is toolfleet's JSON Schema; `invoke` calls
toolfleet (a job is waited for, `wait_timeout_s`) and answers the envelope
as JSON text; `ainvoke` does the same on an `AsyncClient` when one is given,
else on the blocking client in a thread.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Iterable

from .._client import AsyncClient, Client
from ._common import DEFAULT_WAIT_TIMEOUT_S, ToolSpec, arun_tool, run_tool, select

if TYPE_CHECKING:
    from langchain_core.tools import StructuredTool

__all__ = ["structured_tool", "structured_tools"]


def structured_tool(
    client: Client,
    spec: ToolSpec,
    *,
    async_client: AsyncClient | None = None,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    run_id: str | None = None,
) -> StructuredTool:
    """One `StructuredTool` calling the toolfleet tool `spec`."""
    from langchain_core.tools import StructuredTool

    def call(**args: Any) -> str:
        return run_tool(client, spec.name, args, wait_timeout_s=wait_timeout_s, run_id=run_id).to_json()

    async def acall(**args: Any) -> str:
        if async_client is not None:
            envelope = await arun_tool(async_client, spec.name, args, wait_timeout_s=wait_timeout_s, run_id=run_id)
            return envelope.to_json()
        return await asyncio.to_thread(call, **args)

    return StructuredTool.from_function(
        func=call,
        coroutine=acall,
        name=spec.name,
        description=spec.description,
        args_schema=spec.input_schema,
        infer_schema=False,
    )


def structured_tools(
    client: Client,
    names: Iterable[str] | None = None,
    *,
    async_client: AsyncClient | None = None,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    run_id: str | None = None,
) -> list[StructuredTool]:
    """The `StructuredTool`s of the tools the caller may call (`names`, in
    that order, or all of them), read from `GET /v1/tools`."""
    return [
        structured_tool(client, spec, async_client=async_client, wait_timeout_s=wait_timeout_s, run_id=run_id)
        for spec in select(client.tools(), names)
    ]
