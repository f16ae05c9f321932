#!/usr/bin/env python3
"""A tool loop with no framework and no MCP: the model speaks the OpenAI Chat
Completions wire format (`--wire openai`, POST <model-url>/chat/completions)
or Anthropic Messages (`--wire anthropic`, POST <model-url>/messages), over
httpx; its tool calls run through toolfleet with `toolfleet.adapters.loop`,
which answers the tool result messages to append. Prints each tool call to
stderr and the final answer as the last line of stdout (`ANSWER: ...`).

    python3 examples/python/chat_loop_example.py --wire anthropic \\
        --server http://127.0.0.1:8080 --token "$TOOLFLEET_TOKEN" \\
        --model-url https://api.anthropic.com/v1 --api-key "$ANTHROPIC_API_KEY" \\
        --model claude-sonnet-4-5 --input "How many expense lines has 2026-09?"
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx

from toolfleet import Client
from toolfleet.adapters.loop import anthropic_tool_results, openai_tool_messages

SYSTEM = "You help a user with their expenses. Use the tools, then answer briefly."


def pick(specs: list[dict[str, Any]], names: list[str] | None, key: Any) -> list[dict[str, Any]]:
    return [s for s in specs if names is None or key(s) in names]


def openai_loop(tf: Client, model: httpx.Client, args: argparse.Namespace, names: list[str] | None) -> str:
    tools = pick(tf.tools("openai"), names, lambda s: s["function"]["name"])
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": args.input}]
    for _ in range(args.max_turns):
        response = model.post("/chat/completions", json={"model": args.model, "messages": messages, "tools": tools})
        response.raise_for_status()
        reply = response.json()["choices"][0]["message"]
        messages.append({k: v for k, v in reply.items() if v is not None or k == "content"})
        calls = reply.get("tool_calls") or []
        if not calls:
            return str(reply.get("content") or "")
        for call in calls:
            print(f"calling {call['function']['name']}", file=sys.stderr, flush=True)
        messages += openai_tool_messages(tf, calls)
    raise SystemExit(f"no answer within {args.max_turns} turns")


def anthropic_loop(tf: Client, model: httpx.Client, args: argparse.Namespace, names: list[str] | None) -> str:
    tools = pick(tf.tools("anthropic"), names, lambda s: s["name"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": args.input}]
    for _ in range(args.max_turns):
        body = {"model": args.model, "max_tokens": 1024, "system": SYSTEM, "messages": messages, "tools": tools}
        response = model.post("/messages", json=body)
        response.raise_for_status()
        reply = response.json()
        messages.append({"role": "assistant", "content": reply["content"]})
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        if not uses:
            return "".join(b.get("text", "") for b in reply["content"] if b["type"] == "text")
        for use in uses:
            print(f"calling {use['name']}", file=sys.stderr, flush=True)
        messages.append(anthropic_tool_results(tf, reply["content"]))
    raise SystemExit(f"no answer within {args.max_turns} turns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=os.environ.get("TOOLFLEET_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--token", default=os.environ.get("TOOLFLEET_TOKEN"))
    parser.add_argument("--wire", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--model-url", required=True, help="the API root, ending in /v1")
    parser.add_argument("--model", default="llama3.1")
    parser.add_argument("--api-key", default="test")
    parser.add_argument("--tools", default="find_expenses,start_receipt_ocr", help="comma-separated; empty for all")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--input", default="How many expense lines has 2026-09?")
    args = parser.parse_args()
    if not args.token:
        parser.error("--token (or TOOLFLEET_TOKEN) is required")
    names = [n for n in args.tools.split(",") if n] or None
    headers = (
        {"x-api-key": args.api_key, "anthropic-version": "2023-06-01"}
        if args.wire == "anthropic"
        else {"Authorization": f"Bearer {args.api_key}"}
    )
    with Client(args.server, args.token) as tf, httpx.Client(base_url=args.model_url, headers=headers, timeout=120) as model:
        loop = anthropic_loop if args.wire == "anthropic" else openai_loop
        answer = loop(tf, model, args, names)
    print(f"ANSWER: {answer}", flush=True)


if __name__ == "__main__":
    main()
