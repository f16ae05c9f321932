#!/usr/bin/env python3
"""An OpenAI Agents SDK agent whose tools are toolfleet's.

The agent loop runs on any server of the OpenAI Chat Completions wire
format (`--model-url`, e.g. http://127.0.0.1:11434/v1 for Ollama); its
tools are the toolfleet server's (`--server`, `--token`), called through
`toolfleet.adapters.openai_agents`: a job is waited for, so the model reads
its outcome. Prints each tool call to stderr and the final answer as the
last line of stdout (`ANSWER: ...`).

    pip install -e clients/python openai-agents
    python3 examples/python/openai_agents_example.py \\
        --server http://127.0.0.1:8080 --token "$TOOLFLEET_TOKEN" \\
        --model-url http://127.0.0.1:11434/v1 --model llama3.1 \\
        --input "Read the receipts of September 2026's lines without an amount."
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from agents import Agent, OpenAIChatCompletionsModel, RunHooks, Runner, Tool, set_tracing_disabled
from openai import AsyncOpenAI

from toolfleet import AsyncClient
from toolfleet.adapters.openai_agents import function_tools

INSTRUCTIONS = (
    "You help a user with their expenses. Use the tools: list lines with find_expenses, "
    "read receipts with start_receipt_ocr. Answer briefly."
)


class Printed(RunHooks):
    """Says each tool call and its result on stderr."""

    async def on_tool_start(self, context, agent, tool):  # type: ignore[no-untyped-def]
        print(f"calling {tool.name}", file=sys.stderr, flush=True)

    async def on_tool_end(self, context, agent, tool, result):  # type: ignore[no-untyped-def]
        print(f"{tool.name} answered {str(result)[:200]}", file=sys.stderr, flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=os.environ.get("TOOLFLEET_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--token", default=os.environ.get("TOOLFLEET_TOKEN"))
    parser.add_argument("--model-url", required=True, help="an OpenAI Chat Completions API root, ending in /v1")
    parser.add_argument("--model", default="llama3.1")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "test"))
    parser.add_argument("--tools", default="find_expenses,start_receipt_ocr", help="comma-separated; empty for all")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--input", default="How many expense lines has 2026-09, and what do the receipts without an amount say?")
    args = parser.parse_args()
    if not args.token:
        parser.error("--token (or TOOLFLEET_TOKEN) is required")

    # Traces would go to OpenAI's platform; this agent talks to --model-url only.
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model=args.model,
        openai_client=AsyncOpenAI(base_url=args.model_url, api_key=args.api_key),
    )
    names = [n for n in args.tools.split(",") if n] or None
    async with AsyncClient(args.server, args.token) as toolfleet:
        tools: list[Tool] = list(await function_tools(toolfleet, names))
        agent = Agent(name="expenses", instructions=INSTRUCTIONS, model=model, tools=tools)
        result = await Runner.run(agent, args.input, max_turns=args.max_turns, hooks=Printed())
    print(f"ANSWER: {result.final_output}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
