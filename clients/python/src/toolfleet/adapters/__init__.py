"""toolfleet's tools in agent frameworks and model wire formats.

- `toolfleet.adapters.openai_agents`: `FunctionTool`s of the OpenAI Agents
  SDK (`openai-agents`).
- `toolfleet.adapters.langchain`: LangChain `StructuredTool`s
  (`langchain-core`).
- `toolfleet.adapters.loop`: a plain tool loop for the OpenAI Chat
  Completions and Anthropic Messages wire formats: the model's tool calls
  in, the tool result messages out.

Each module imports its framework only when used, so the core package needs
httpx alone. Every adapter hands the model toolfleet's envelope as JSON
text: `ok` with its `result`, a tool's `error` with a message written for a
model, `suspended` with a ticket. A job's `running` envelope is waited for
(up to `wait_timeout_s`) and the model gets the job's outcome; a job that
has not settled by then reaches the model as `running` with its `job_id`,
which it can pass to `get_job`.
"""

from __future__ import annotations

from ._common import (
    DEFAULT_WAIT_TIMEOUT_S,
    ToolSpec,
    arun_tool,
    bad_arguments,
    parse_arguments,
    run_tool,
)

__all__ = [
    "DEFAULT_WAIT_TIMEOUT_S",
    "ToolSpec",
    "arun_tool",
    "bad_arguments",
    "parse_arguments",
    "run_tool",
]
