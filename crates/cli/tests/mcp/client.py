#!/usr/bin/env python3
"""A real MCP client (the official Python SDK, `mcp`) against toolfleet, for
crates/cli/tests/mcp.rs.

    client.py http  URL TOKEN MODE [OTHER_TOKEN]
    client.py stdio BINARY CONFIG TOKEN MODE

Each connection is made twice: a plain client (no capabilities: the running
and suspended envelopes) and a rich one (the tasks extension and an
elicitation callback that answers "travel"). OTHER_TOKEN, another tenant's,
must not see or cancel the rich client's task.

MODE is the SDK's connect mode: `auto` (server/discover, 2026-07-28) or
`legacy` (the initialize handshake). Each check that fails raises; on success
the script prints one JSON line of what it saw and exits 0.
"""

import asyncio
import json
import sys
import urllib.error
import urllib.request

from typing import Any, Literal

import httpx2
import mcp_types
from mcp_types import _v2025_11_25 as v2025
from mcp import Client, StdioServerParameters, types
from mcp.client.extension import ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError

TASKS = "io.modelcontextprotocol/tasks"


class TaskParams(types.RequestParams):
    task_id: str


class TaskHandle(mcp_types.Result):
    """`tools/call` answered a task (the tasks extension, resultType "task")."""

    result_type: Literal["task"]
    task_id: str
    status: str
    poll_interval_ms: int | None = None


class TaskState(mcp_types.Result):
    """A `tasks/get` answer."""

    model_config = {"extra": "allow"}
    task_id: str
    status: str
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskRequest(types.Request):
    # 2026-07-28 over HTTP: the task id travels in the Mcp-Name header too.
    name_param = "taskId"


async def task_request(session, method, task_id, model):
    return await session.send_request(TaskRequest(method=method, params=TaskParams(task_id=task_id)), model)


class Tasks(ClientExtension):
    """The tasks extension: a claimed task is polled with tasks/get until it
    settles; a completed one's result is the tool result."""

    identifier = TASKS

    def __init__(self):
        self.seen = []

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle, ctx):
        # A quick job may settle before its task is answered.
        check(handle.status in ("working", "completed"), f"a new task is neither working nor done: {handle}")
        check(handle.poll_interval_ms and handle.poll_interval_ms >= 1000, f"pollIntervalMs: {handle}")
        self.seen.append(handle.task_id)
        for _ in range(240):
            state = await task_request(ctx.session, "tasks/get", handle.task_id, TaskState)
            check(state.task_id == handle.task_id, f"another task answered: {state}")
            if state.status == "completed":
                check(state.result is not None, f"a completed task without its result: {state}")
                return types.CallToolResult.model_validate(state.result, by_name=False)
            check(state.status == "working", f"the task settled badly: {state}")
            await asyncio.sleep(0.25)
        raise AssertionError(f"task {handle.task_id} did not settle")


async def raw_request(session, method, **params):
    """A request whose answer is checked here, against the revision's own
    models: the SDK's typed path knows no 2025-11-25 task results."""
    data = {"method": method, "params": params}
    options = {}
    session._stamp(data, options)
    return await session._dispatcher.send_raw_request(method, data.get("params"), options)


async def core_tasks(session, receipts):
    """The tasks of 2025-11-25 (task-augmented tools/call, tasks/get,
    tasks/result, tasks/list, tasks/cancel, execution.taskSupport), each
    answer checked against the SDK's models of that revision."""
    seen = {}
    tools, cursor = {}, None
    for _ in range(50):
        listed = await raw_request(session, "tools/list", **({"cursor": cursor} if cursor else {}))
        tools.update({t["name"]: t for t in listed["tools"]})
        cursor = listed.get("nextCursor")
        if not cursor:
            break
    support = {name: v2025.Tool.model_validate(t).execution for name, t in tools.items()}
    seen["task_support"] = {name: (e.task_support if e else None) for name, e in support.items()}
    created = await raw_request(
        session, "tools/call", name="start_receipt_ocr", arguments={"receipt_ids": receipts}, task={"ttl": 60000}
    )
    task = v2025.CreateTaskResult.model_validate(created).task
    check(task.status in ("working", "completed"), f"a new task: {task}")
    check(task.poll_interval and task.poll_interval >= 1000, f"pollInterval: {task}")
    state = v2025.GetTaskResult.model_validate(await raw_request(session, "tasks/get", taskId=task.task_id))
    check(state.task_id == task.task_id, f"tasks/get answered another task: {state}")
    # tasks/result waits for the job, then answers the tool's result.
    result = await raw_request(session, "tasks/result", taskId=task.task_id)
    done = types.CallToolResult.model_validate(result, by_name=False)
    check(not done.is_error, f"the task's result is an error: {result}")
    check(done.structured_content and "receipts" in done.structured_content, f"the task's result: {result}")
    related = (result.get("_meta") or {}).get("io.modelcontextprotocol/related-task", {})
    check(related.get("taskId") == task.task_id, f"the result names no task: {result}")
    seen["task_result"] = done.structured_content
    state = v2025.GetTaskResult.model_validate(await raw_request(session, "tasks/get", taskId=task.task_id))
    check(state.status == "completed", f"after its result: {state}")
    listed = v2025.ListTasksResult.model_validate(await raw_request(session, "tasks/list"))
    check(any(t.task_id == task.task_id for t in listed.tasks), f"tasks/list lacks {task.task_id}")
    # A settled task cannot be cancelled.
    try:
        await raw_request(session, "tasks/cancel", taskId=task.task_id)
        raise AssertionError("a completed task was cancelled")
    except MCPError as refused:
        check("cannot be cancelled" in refused.error.message, f"tasks/cancel: {refused.error}")
    # A second task, cancelled (unless it is already done).
    second = v2025.CreateTaskResult.model_validate(
        await raw_request(
            session, "tools/call", name="start_receipt_ocr", arguments={"receipt_ids": receipts[:1]}, task={}
        )
    ).task
    try:
        cancelled = v2025.CancelTaskResult.model_validate(await raw_request(session, "tasks/cancel", taskId=second.task_id))
        check(cancelled.status == "cancelled", f"after tasks/cancel: {cancelled}")
        seen["cancelled_status"] = "cancelled"
    except MCPError as refused:
        check("cannot be cancelled" in refused.error.message, f"tasks/cancel: {refused.error}")
        seen["cancelled_status"] = "completed"
    # A query lists no task support: called as a task, it is refused (-32601).
    try:
        await raw_request(session, "tools/call", name="find_expenses", arguments={"month": "2026-09"}, task={})
        raise AssertionError("a query ran as a task")
    except MCPError as refused:
        check(refused.error.code == -32601, f"a query called as a task: {refused.error}")
    try:
        await raw_request(session, "tasks/get", taskId="01a00000-0000-7000-8000-000000000000")
        raise AssertionError("an unknown task was found")
    except MCPError:
        pass
    return seen


async def answer_travel(_context, params):
    schema = params.requested_schema
    answer = schema["properties"]["answer"]
    check(answer.get("enum") == ["travel", "meals"], f"the options are not the enum: {schema}")
    ANSWERED.append(params.message)
    return types.ElicitResult(action="accept", content={"answer": "travel"})


ANSWERED = []


def check(condition, what):
    if not condition:
        raise AssertionError(what)


async def exercise(client):
    seen = {"protocol_version": client.protocol_version}

    # Every page of tools/list, following nextCursor.
    tools, cursor, pages = [], None, 0
    while True:
        page = await client.list_tools(cursor=cursor)
        pages += 1
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
        check(pages < 50, "tools/list never ends")
    names = [t.name for t in tools]
    seen["pages"] = pages
    seen["tools"] = names
    by_name = {t.name: t for t in tools}
    for name in ["find_expenses", "start_receipt_ocr", "get_job"]:
        check(name in by_name, f"{name} is not listed: {names}")
    find = by_name["find_expenses"]
    check(find.title == "Find expense lines", f"title: {find.title!r}")
    check(find.input_schema.get("required") == ["month"], f"inputSchema: {find.input_schema}")
    check(find.annotations is not None, "find_expenses has no annotations")
    check(find.annotations.read_only_hint is True, f"readOnlyHint: {find.annotations}")
    check(find.annotations.idempotent_hint is True, f"idempotentHint: {find.annotations}")
    ocr = by_name["start_receipt_ocr"]
    check(ocr.annotations.read_only_hint is not True, f"a job is not read-only: {ocr.annotations}")

    # A query: structuredContent and the same JSON as text.
    found = await client.call_tool("find_expenses", {"month": "2026-09"})
    check(not found.is_error, f"find_expenses failed: {found}")
    structured = found.structured_content
    check(isinstance(structured, dict) and "lines" in structured, f"structuredContent: {structured}")
    check(json.loads(found.content[0].text) == structured, "the text is not the structuredContent's JSON")
    seen["lines"] = len(structured["lines"])
    receipts = [l["receipt_id"] for l in structured["lines"] if l.get("receipt_id")][:2]
    check(receipts, f"no line has a receipt: {structured['lines'][:3]}")

    # Bad arguments: a result with isError and a message naming the field.
    bad = await client.call_tool("find_expenses", {"month": "Sept"})
    check(bad.is_error, f"bad arguments were not an error: {bad}")
    text = bad.content[0].text
    check("invalid_arguments" in text and "month" in text, f"the message: {text}")
    seen["bad_arguments"] = text

    # A job: the running envelope, then get_job until it settles.
    started = await client.call_tool("start_receipt_ocr", {"receipt_ids": receipts})
    check(not started.is_error, f"start_receipt_ocr failed: {started}")
    running = started.structured_content
    check(running and running.get("status") == "running", f"not running: {started}")
    job_id = running["job_id"]
    for _ in range(120):
        polled = await client.call_tool("get_job", {"job_id": job_id})
        check(not polled.is_error, f"get_job failed: {polled}")
        envelope = polled.structured_content
        # get_job answers the job's envelope.
        status = envelope.get("status")
        if status == "ok":
            seen["job_result"] = envelope["result"]
            break
        check(status == "running", f"the job settled badly: {polled}")
        await asyncio.sleep(0.25)
    else:
        raise AssertionError(f"job {job_id} did not settle")

    # A human tool: the suspended envelope with its ticket.
    asked = await client.call_tool("ask_user", {"question": "Which category?", "options": ["travel", "meals"]})
    suspended = asked.structured_content
    check(suspended and suspended.get("status") == "suspended" and suspended.get("ticket"), f"not suspended: {asked}")
    return seen


async def exercise_rich(client, tasks, streams):
    """With the tasks extension and elicitation: a job runs as a task to
    its result, a second is cancelled, ask_user asks the client."""
    seen = {}
    modern = client.protocol_version >= "2026-07-28"
    found = await client.call_tool("find_expenses", {"month": "2026-09"})
    receipts = [l["receipt_id"] for l in found.structured_content["lines"] if l.get("receipt_id")][:2]
    if modern:
        done = await client.call_tool("start_receipt_ocr", {"receipt_ids": receipts})
        check(tasks.seen, "the job did not become a task")
        check(not done.is_error, f"the task's result is an error: {done}")
        check(done.structured_content and "receipts" in done.structured_content, f"the task's result: {done}")
        seen["task_result"] = done.structured_content
        seen["task_id"] = tasks.seen[-1]
        # A second task, cancelled.
        handle = await client.session.call_tool("start_receipt_ocr", {"receipt_ids": receipts[:1]}, allow_claimed=True)
        check(isinstance(handle, TaskHandle), f"not a task: {handle}")
        await task_request(client.session, "tasks/cancel", handle.task_id, mcp_types.Result)
        state = await task_request(client.session, "tasks/get", handle.task_id, TaskState)
        # A job already done stays done; one still queued or running is cancelled.
        check(state.status in ("cancelled", "completed"), f"after tasks/cancel: {state}")
        seen["cancelled_status"] = state.status
        # An unknown task is an error.
        try:
            await task_request(client.session, "tasks/get", "01a00000-0000-7000-8000-000000000000", TaskState)
            raise AssertionError("an unknown task was found")
        except MCPError:
            pass
    else:
        # A call without a task: the running envelope.
        started = await client.call_tool("start_receipt_ocr", {"receipt_ids": receipts})
        check(started.structured_content.get("status") == "running", f"not running: {started}")
        seen["core_tasks"] = await core_tasks(client.session, receipts)
    if not modern:
        # Progress: a job call with a progress token is waited on, with news.
        progress = []

        async def on_progress(value, total, message):
            progress.append((value, total, message))

        followed = await client.call_tool("start_receipt_ocr", {"receipt_ids": receipts}, progress_callback=on_progress)
        check(not followed.is_error, f"the followed job: {followed}")
        check(followed.structured_content and "receipts" in followed.structured_content, f"not settled: {followed}")
        check(progress, "no progress was notified")
        seen["progress"] = len(progress)
    # ask_user: the question goes to the client where it can be asked.
    before = len(ANSWERED)
    asked = await client.call_tool("ask_user", {"question": "Which category?", "options": ["travel", "meals"]})
    if modern or streams:
        check(len(ANSWERED) == before + 1, f"the question was not asked: {asked}")
        check(not asked.is_error, f"the answered ask_user is an error: {asked}")
        check("travel" in json.dumps(asked.structured_content), f"the answer is not in the result: {asked}")
        seen["elicited"] = asked.structured_content
    else:
        # Without a session before 2026-07-28 nothing can ask: the suspended envelope.
        check(asked.structured_content.get("status") == "suspended", f"not suspended: {asked}")
        seen["elicited"] = None
    return seen


def rich(target, mode, tasks):
    return Client(target, mode=mode, extensions=[tasks], elicitation_callback=answer_travel)


async def over_http(url, token, mode, other=None):
    # Without a token: 401, a Bearer challenge naming the resource metadata.
    request = urllib.request.Request(
        url,
        data=b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
        method="POST",
    )
    try:
        urllib.request.urlopen(request, timeout=10)
        raise AssertionError("no token was accepted")
    except urllib.error.HTTPError as refused:
        check(refused.code == 401, f"no token: HTTP {refused.code}")
        challenge = refused.headers.get("WWW-Authenticate", "")
        check(challenge.startswith("Bearer ") and "resource_metadata=" in challenge, f"challenge: {challenge}")
        metadata_url = challenge.split('resource_metadata="', 1)[1].split('"', 1)[0]
    with urllib.request.urlopen(metadata_url, timeout=10) as answer:
        metadata = json.load(answer)
    check(metadata.get("resource") == url, f"metadata: {metadata}")
    # The SDK's own client is refused too.
    try:
        async with Client(url, mode=mode) as _:
            raise AssertionError("the SDK connected without a token")
    except AssertionError:
        raise
    except Exception:  # noqa: BLE001 - any refusal will do
        pass
    # A foreign Origin is refused.
    foreign = urllib.request.Request(
        url,
        data=b"{}",
        headers={"Authorization": f"Bearer {token}", "Origin": "http://evil.example", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        urllib.request.urlopen(foreign, timeout=10)
        raise AssertionError("a foreign Origin was accepted")
    except urllib.error.HTTPError as refused:
        check(refused.code == 403, f"foreign Origin: HTTP {refused.code}")

    # Each revision's initialize handshake, on the wire.
    versions = {}
    for asked in ["2025-06-18", "2025-11-25"]:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
        }
        raw = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
            method="POST",
        )
        with urllib.request.urlopen(raw, timeout=10) as answer:
            text = answer.read().decode()
        if text.lstrip().startswith("{"):
            reply = json.loads(text)
        else:  # an SSE answer: the data line
            reply = json.loads(next(l[5:] for l in text.splitlines() if l.startswith("data:") and l[5:].strip()))
        versions[asked] = reply["result"]["protocolVersion"]
        check(versions[asked] == asked, f"initialize {asked} answered {reply}")
        tasks_capability = reply["result"]["capabilities"].get("tasks")
        if asked == "2025-11-25":
            check(
                tasks_capability == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
                f"the tasks capability of 2025-11-25: {reply}",
            )
        else:
            check(tasks_capability is None, f"{asked} has no tasks: {reply}")

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    from mcp.client.streamable_http import streamable_http_client

    async with http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            seen = await exercise(client)
        tasks = Tasks()
        async with rich(streamable_http_client(url, http_client=http), mode, tasks) as client:
            # The initialize handshake opens a session, in which the server asks.
            seen["rich"] = await exercise_rich(client, tasks, streams=True)
    task_id = seen["rich"].get("task_id")
    if other and task_id:
        # Another tenant's task is not found, to read or to cancel.
        theirs = httpx2.AsyncClient(headers={"Authorization": f"Bearer {other}"}, timeout=30)
        async with theirs:
            async with rich(streamable_http_client(url, http_client=theirs), mode, Tasks()) as client:
                for method in ["tasks/get", "tasks/cancel"]:
                    try:
                        await task_request(client.session, method, task_id, TaskState if method == "tasks/get" else mcp_types.Result)
                        raise AssertionError(f"another tenant's {method} was answered")
                    except MCPError as refused:
                        check("no task" in refused.error.message, f"{method}: {refused.error}")
        seen["foreign_refused"] = True
    seen["handshakes"] = versions
    return seen


async def over_stdio(binary, config, token, mode):
    params = StdioServerParameters(
        command=binary,
        args=["--config", config, "mcp"],
        env={"TOOLFLEET_TOKEN": token, "TOOLFLEET_LOG": "warn"},
    )
    async with Client(params, mode=mode) as client:
        seen = await exercise(client)
    tasks = Tasks()
    async with rich(params, mode, tasks) as client:
        seen["rich"] = await exercise_rich(client, tasks, streams=True)
    return seen


def main(argv):
    if len(argv) >= 4 and argv[1] == "http":
        seen = asyncio.run(
            over_http(argv[2], argv[3], argv[4] if len(argv) > 4 else "auto", argv[5] if len(argv) > 5 else None)
        )
    elif len(argv) >= 5 and argv[1] == "stdio":
        seen = asyncio.run(over_stdio(argv[2], argv[3], argv[4], argv[5] if len(argv) > 5 else "auto"))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
