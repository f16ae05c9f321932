"""The adapters call the real server: LangChain's tools, the Agents SDK's
function tools and the plain tool loop's messages."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
from types import ModuleType
from typing import Any, Callable

import pytest

from toolfleet import AsyncClient, Client
from toolfleet.adapters.loop import (
    aanthropic_tool_results,
    anthropic_tool_results,
    aopenai_tool_messages,
    openai_tool_messages,
)

OCR = "start_receipt_ocr"


def need(module: str) -> ModuleType:
    """The framework `module`; skipped where it is missing, but under CI,
    which installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{module} is not installed")


def test_the_core_imports_no_framework() -> None:
    # A fresh interpreter: importing toolfleet and its adapters' modules
    # loads neither framework until a tool is made.
    import subprocess
    import sys

    code = (
        "import sys, toolfleet, toolfleet.adapters.langchain, toolfleet.adapters.openai_agents, toolfleet.adapters.loop\n"
        "print(sorted(m for m in ('agents', 'langchain_core', 'openai') if m in sys.modules))"
    )
    from conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO / "clients" / "python" / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_langchain_tools_invoke_toolfleet(client: Client, make_async: Callable[[], AsyncClient]) -> None:
    need("langchain_core")
    from langchain_core.messages import ToolMessage

    from toolfleet.adapters.langchain import structured_tools

    tools = structured_tools(client, ["find_expenses", OCR])
    find, ocr = tools
    assert find.name == "find_expenses" and "expense lines" in find.description
    assert set(find.args) == {"month", "cursor"}

    page = json.loads(find.invoke({"month": "2026-09"}))
    assert page["status"] == "ok" and len(page["result"]["lines"]) == 50
    # A job is waited for: the model reads its result.
    job = json.loads(ocr.invoke({"receipt_ids": ["rcpt-005"]}))
    assert job["status"] == "ok" and job["result"]["receipts"][0]["receipt_id"] == "rcpt-005"
    # A tool's error comes back for the model to read.
    bad = json.loads(find.invoke({"month": "Sept"}))
    assert bad["status"] == "error" and bad["error"]["code"] == "invalid_arguments"
    # A model's tool call becomes a ToolMessage.
    message = find.invoke({"name": "find_expenses", "args": {"month": "2026-10"}, "id": "call_1", "type": "tool_call"})
    assert isinstance(message, ToolMessage) and message.tool_call_id == "call_1"
    assert json.loads(str(message.content))["status"] == "ok"

    async def main() -> Any:
        async with make_async() as atf:
            (aocr,) = structured_tools(client, [OCR], async_client=atf)
            return json.loads(await aocr.ainvoke({"receipt_ids": ["rcpt-015"]}))

    assert asyncio.run(main())["result"]["receipts"][0]["receipt_id"] == "rcpt-015"

    with pytest.raises(KeyError):
        structured_tools(client, ["no_such_tool"])


def test_agents_function_tools_invoke_toolfleet(client: Client, make_async: Callable[[], AsyncClient]) -> None:
    need("agents")
    from agents import FunctionTool
    from agents.tool_context import ToolContext

    from toolfleet.adapters.openai_agents import function_tools

    async def main() -> list[Any]:
        async with make_async() as atf:
            tools = await function_tools(atf, [OCR, "find_expenses"])
            blocking = await function_tools(client, ["find_expenses"])
            assert all(isinstance(t, FunctionTool) for t in tools + blocking)
            ocr, find = tools
            assert ocr.name == OCR and ocr.strict_json_schema is False
            assert ocr.params_json_schema["required"] == ["receipt_ids"]

            def context(tool: FunctionTool, arguments: str) -> ToolContext[Any]:
                return ToolContext(context=None, tool_name=tool.name, tool_call_id="call_1", tool_arguments=arguments)

            arguments = json.dumps({"receipt_ids": ["rcpt-025"]})
            job = await ocr.on_invoke_tool(context(ocr, arguments), arguments)
            bad = await find.on_invoke_tool(context(find, "{not json"), "{not json")
            page = await blocking[0].on_invoke_tool(context(find, '{"month": "2026-09"}'), '{"month": "2026-09"}')
            return [json.loads(job), json.loads(bad), json.loads(page)]

    job, bad, page = asyncio.run(main())
    assert job["status"] == "ok" and job["result"]["receipts"][0]["receipt_id"] == "rcpt-025"
    assert bad["status"] == "error" and bad["error"]["code"] == "invalid_arguments"
    assert page["status"] == "ok" and len(page["result"]["lines"]) == 50


OPENAI_CALLS = [
    {"id": "call_a", "type": "function", "function": {"name": "find_expenses", "arguments": '{"month": "2026-09"}'}},
    {"id": "call_b", "type": "function", "function": {"name": OCR, "arguments": '{"receipt_ids": ["rcpt-035"]}'}},
    {"id": "call_c", "type": "function", "function": {"name": "find_expenses", "arguments": '{"month": "Sept"}'}},
    {"id": "call_d", "type": "function", "function": {"name": "find_expenses", "arguments": "[1, 2"}},
    {"id": "call_e", "type": "function", "function": {"name": "ask_user", "arguments": '{"question": "Travel?"}'}},
]


def _check_openai(messages: list[dict[str, Any]]) -> None:
    assert [m["role"] for m in messages] == ["tool"] * 5
    assert [m["tool_call_id"] for m in messages] == ["call_a", "call_b", "call_c", "call_d", "call_e"]
    envelopes = [json.loads(m["content"]) for m in messages]
    assert envelopes[0]["status"] == "ok" and len(envelopes[0]["result"]["lines"]) == 50
    assert envelopes[1]["status"] == "ok" and envelopes[1]["result"]["receipts"][0]["receipt_id"] == "rcpt-035"
    assert envelopes[2]["error"]["code"] == "invalid_arguments" and "/month" in envelopes[2]["error"]["message"]
    assert envelopes[3]["error"]["code"] == "invalid_arguments" and "find_expenses" in envelopes[3]["error"]["message"]
    assert envelopes[4]["status"] == "suspended" and envelopes[4]["ticket"].startswith("t_")


def test_the_openai_loop_builds_tool_messages(client: Client, make_async: Callable[[], AsyncClient]) -> None:
    _check_openai(openai_tool_messages(client, OPENAI_CALLS))

    async def main() -> list[dict[str, Any]]:
        async with make_async() as atf:
            return await aopenai_tool_messages(atf, OPENAI_CALLS)

    _check_openai(asyncio.run(main()))


def test_the_openai_loop_takes_the_sdks_objects(client: Client) -> None:
    need("openai")
    from openai.types.chat import ChatCompletionMessage

    message = ChatCompletionMessage.model_validate({"role": "assistant", "content": None, "tool_calls": OPENAI_CALLS[:2]})
    messages = openai_tool_messages(client, message.tool_calls or [])
    assert [m["tool_call_id"] for m in messages] == ["call_a", "call_b"]
    assert all(json.loads(m["content"])["status"] == "ok" for m in messages)


ANTHROPIC_CONTENT = [
    {"type": "text", "text": "Let me look."},
    {"type": "tool_use", "id": "toolu_1", "name": OCR, "input": {"receipt_ids": ["rcpt-045"]}},
    {"type": "tool_use", "id": "toolu_2", "name": "find_expenses", "input": {"month": "13-2026"}},
    {"type": "tool_use", "id": "toolu_3", "name": "find_expenses", "input": {"month": "2026-09"}},
]


def _check_anthropic(message: dict[str, Any]) -> None:
    assert message["role"] == "user"
    blocks = message["content"]
    assert [b["type"] for b in blocks] == ["tool_result"] * 3
    assert [b["tool_use_id"] for b in blocks] == ["toolu_1", "toolu_2", "toolu_3"]
    assert [b.get("is_error", False) for b in blocks] == [False, True, False]
    job, bad, page = (json.loads(b["content"]) for b in blocks)
    assert job["status"] == "ok" and job["result"]["receipts"][0]["receipt_id"] == "rcpt-045"
    assert bad["error"]["code"] == "invalid_arguments"
    assert page["status"] == "ok" and page["result"]["next_cursor"]


def test_the_anthropic_loop_builds_tool_results(client: Client, make_async: Callable[[], AsyncClient]) -> None:
    _check_anthropic(anthropic_tool_results(client, ANTHROPIC_CONTENT))

    async def main() -> dict[str, Any]:
        async with make_async() as atf:
            return await aanthropic_tool_results(atf, ANTHROPIC_CONTENT)

    _check_anthropic(asyncio.run(main()))


def test_the_loop_puts_its_calls_in_the_run(client: Client) -> None:
    run = client.start_run(checkpoint={})
    messages = openai_tool_messages(client, OPENAI_CALLS[1:2], run_id=run["run_id"])
    assert json.loads(messages[0]["content"])["status"] == "ok"
    jobs = client.list_jobs(tool=OCR, limit=100)["jobs"]
    assert run["run_id"] in [j["run_id"] for j in jobs]
