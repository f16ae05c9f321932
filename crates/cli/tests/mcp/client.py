#!/usr/bin/env python3
"""A real MCP client (the official Python SDK, `mcp`) against toolfleet, for
crates/cli/tests/mcp.rs.

    client.py http  URL TOKEN MODE
    client.py stdio BINARY CONFIG TOKEN MODE

MODE is the SDK's connect mode: `auto` (server/discover, 2026-07-28) or
`legacy` (the initialize handshake). Each check that fails raises; on success
the script prints one JSON line of what it saw and exits 0.
"""

import asyncio
import json
import sys
import urllib.error
import urllib.request

import httpx2
from mcp import Client, StdioServerParameters


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
    return seen


async def over_http(url, token, mode):
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

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    from mcp.client.streamable_http import streamable_http_client

    async with http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            seen = await exercise(client)
    seen["handshakes"] = versions
    return seen


async def over_stdio(binary, config, token, mode):
    params = StdioServerParameters(
        command=binary,
        args=["--config", config, "mcp"],
        env={"TOOLFLEET_TOKEN": token, "TOOLFLEET_LOG": "warn"},
    )
    async with Client(params, mode=mode) as client:
        return await exercise(client)


def main(argv):
    if len(argv) >= 4 and argv[1] == "http":
        seen = asyncio.run(over_http(argv[2], argv[3], argv[4] if len(argv) > 4 else "auto"))
    elif len(argv) >= 5 and argv[1] == "stdio":
        seen = asyncio.run(over_stdio(argv[2], argv[3], argv[4], argv[5] if len(argv) > 5 else "auto"))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
