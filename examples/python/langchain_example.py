#!/usr/bin/env python3
"""toolfleet's tools as LangChain `StructuredTool`s in a tool loop.

The model is any server of the OpenAI Chat Completions wire format
(`--model-url`), asked over httpx with the tools as
`convert_to_openai_tool` describes them (a LangChain chat model's
`bind_tools(tools)` does the same); each tool call the model makes is
handed to its LangChain tool (`tool.invoke(tool_call)` answers a
`ToolMessage`), which calls toolfleet and waits for a job. Prints each
tool call to stderr and the final answer as the last line of stdout
(`ANSWER: ...`).

    pip install -e clients/python langchain-core
    python3 examples/python/langchain_example.py \\
        --server http://127.0.0.1:8080 --token "$TOOLFLEET_TOKEN" \\
        --model-url http://127.0.0.1:11434/v1 --model llama3.1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx
from langchain_core.messages import ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from toolfleet import Client
from toolfleet.adapters.langchain import structured_tools

SYSTEM = "You help a user with their expenses. Use the tools, then answer briefly."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=os.environ.get("TOOLFLEET_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--token", default=os.environ.get("TOOLFLEET_TOKEN"))
    parser.add_argument("--model-url", required=True, help="an OpenAI Chat Completions API root, ending in /v1")
    parser.add_argument("--model", default="llama3.1")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "test"))
    parser.add_argument("--tools", default="find_expenses,start_receipt_ocr", help="comma-separated; empty for all")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--input", default="How many expense lines has 2026-09?")
    args = parser.parse_args()
    if not args.token:
        parser.error("--token (or TOOLFLEET_TOKEN) is required")

    with Client(args.server, args.token) as tf, httpx.Client(
        base_url=args.model_url, headers={"Authorization": f"Bearer {args.api_key}"}, timeout=120
    ) as model:
        tools = {t.name: t for t in structured_tools(tf, [n for n in args.tools.split(",") if n] or None)}
        specs = [convert_to_openai_tool(t) for t in tools.values()]
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": args.input}]
        for _ in range(args.max_turns):
            response = model.post("/chat/completions", json={"model": args.model, "messages": messages, "tools": specs})
            response.raise_for_status()
            reply = response.json()["choices"][0]["message"]
            messages.append({k: v for k, v in reply.items() if v is not None or k == "content"})
            calls = reply.get("tool_calls") or []
            if not calls:
                print(f"ANSWER: {reply.get('content') or ''}", flush=True)
                return
            for call in calls:
                name = call["function"]["name"]
                print(f"calling {name}", file=sys.stderr, flush=True)
                tool_call = {
                    "name": name,
                    "args": json.loads(call["function"]["arguments"] or "{}"),
                    "id": call["id"],
                    "type": "tool_call",
                }
                result: ToolMessage = tools[name].invoke(tool_call)
                messages.append({"role": "tool", "tool_call_id": result.tool_call_id, "content": result.content})
        raise SystemExit(f"no answer within {args.max_turns} turns")


if __name__ == "__main__":
    main()
