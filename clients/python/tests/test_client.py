"""The blocking client against a real `toolfleet serve` (conftest.py)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import WEBHOOK_SECRET, HookReceiver, Server

from toolfleet import Call, Client, SseEvent, ToolfleetConnectionError, ToolfleetError, sign_webhook, verify_webhook

OCR = "start_receipt_ocr"


def test_tools_in_every_format(client: Client) -> None:
    neutral = client.tools()
    names = {spec["name"] for spec in neutral}
    assert {"find_expenses", "submit_report", OCR, "ask_user", "get_job", "cancel_job", "read_handle"} <= names
    find = next(s for s in neutral if s["name"] == "find_expenses")
    assert find["shape"] == "query"
    assert find["input_schema"]["required"] == ["month"]

    openai = client.tools("openai")
    assert {t["function"]["name"] for t in openai} == names
    assert all(t["type"] == "function" for t in openai)
    responses = client.tools("openai-responses")
    assert {t["name"] for t in responses} == names
    anthropic = client.tools("anthropic")
    assert {t["name"] for t in anthropic} == names
    assert all("input_schema" in t for t in anthropic)
    gemini = client.tools("gemini")
    declarations = gemini[0]["functionDeclarations"] if isinstance(gemini, list) else gemini["functionDeclarations"]
    assert {d["name"] for d in declarations} == names
    mcp = client.tools("mcp")
    assert {t["name"] for t in mcp} == names
    assert all("inputSchema" in t for t in mcp)

    with pytest.raises(ToolfleetError) as refused:
        client.tools("cobol")
    assert refused.value.status == 400
    assert refused.value.code == "bad_request"


def test_a_query_answers_ok(client: Client) -> None:
    page = client.call("find_expenses", {"month": "2026-09"})
    assert page.ok and page.status == "ok"
    assert page.call_id
    assert len(page.result["lines"]) == 50
    cursor = page.result["next_cursor"]
    second = client.call("find_expenses", {"month": "2026-09", "cursor": cursor})
    assert second.ok
    assert second.result.get("next_cursor") is None
    assert json.loads(page.to_json())["result"]["next_cursor"] == cursor


def test_bad_arguments_are_an_error_envelope_not_an_exception(client: Client) -> None:
    envelope = client.call("find_expenses", {"month": "Sept"})
    assert envelope.is_error
    assert envelope.error is not None
    assert envelope.error.code == "invalid_arguments"
    assert "/month" in envelope.error.message
    assert envelope.error.retryable is False
    assert envelope.error.details["violations"][0]["path"] == "/month"
    with pytest.raises(ToolfleetError) as raised:
        envelope.raise_for_error()
    assert raised.value.code == "invalid_arguments"

    unknown = client.call("find_expense", {})
    assert unknown.error is not None and unknown.error.code == "unknown_tool"
    assert "find_expenses" in unknown.error.details["suggestions"]


def test_a_job_is_waited_for_until_it_succeeds(client: Client) -> None:
    started = client.call(OCR, {"receipt_ids": ["rcpt-005", "rcpt-015"]})
    assert started.running
    assert started.job_id and started.poll_after_s
    done = client.wait_job(started.job_id, timeout_s=30)
    assert done.ok, done.raw
    receipts = {r["receipt_id"] for r in done.result["receipts"]}
    assert receipts == {"rcpt-005", "rcpt-015"}
    # Read again, long-polled: the same outcome at once.
    again = client.get_job(started.job_id, wait_s=5)
    assert again.ok and again.result == done.result
    # The job list has it, succeeded.
    listed = client.list_jobs(tool=OCR, state="succeeded", limit=100)
    assert started.job_id in [j["job_id"] for j in listed["jobs"]]
    # call_and_wait does both.
    both = client.call_and_wait(OCR, {"receipt_ids": ["rcpt-025"]}, timeout_s=30)
    assert both.ok and both.result["receipts"][0]["receipt_id"] == "rcpt-025"


def test_a_missing_job_raises(client: Client) -> None:
    with pytest.raises(ToolfleetError) as raised:
        client.get_job(str(uuid.uuid4()))
    assert raised.value.code == "not_found"
    assert raised.value.envelope is not None and raised.value.envelope["status"] == "error"


def test_a_scheduled_job_is_cancelled_as_its_state_says(client: Client) -> None:
    started = client.call(OCR, {"receipt_ids": ["rcpt-035"]}, delay_s=600)
    assert started.running
    scheduled = client.get_job(started.job_id or "")
    assert scheduled.state == "scheduled" and scheduled.run_at
    cancelled = client.cancel_job(started.job_id or "")
    assert cancelled.is_error and cancelled.state == "cancelled"
    assert cancelled.error is not None and cancelled.error.code == "cancelled"
    # A settled job's error is its outcome: a value, not an exception.
    assert client.wait_job(started.job_id or "", timeout_s=5).state == "cancelled"

    at = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    later = client.call(OCR, {"receipt_ids": ["rcpt-035"]}, run_at=at)
    scheduled = client.get_job(later.job_id or "")
    assert scheduled.state == "scheduled"
    assert datetime.fromisoformat((scheduled.run_at or "").replace("Z", "+00:00")) == at
    assert client.cancel_job(later.job_id or "").state == "cancelled"


def test_many_calls_in_one_request(client: Client) -> None:
    results = client.call_many(
        [
            ("find_expenses", {"month": "2026-09"}),
            Call(OCR, {"receipt_ids": ["rcpt-045"]}),
            {"tool": "find_expenses", "args": {"month": "nope"}},
            Call(OCR, {"receipt_ids": ["rcpt-055"]}, priority=5),
        ]
    )
    assert [r.status for r in results] == ["ok", "running", "error", "error"]
    assert results[2].error is not None and results[2].error.code == "invalid_arguments"
    # The OCR pool is not ordered: a priority is that call's own bad_request.
    assert results[3].error is not None and results[3].error.code == "bad_request"
    assert client.wait_job(results[1].job_id or "", timeout_s=30).ok
    with pytest.raises(ToolfleetError) as empty:
        client.call_many([])
    assert empty.value.status == 400


def test_an_idempotency_key_names_one_job(client: Client) -> None:
    key = f"py-{uuid.uuid4()}"
    first = client.call(OCR, {"receipt_ids": ["rcpt-005"]}, idempotency_key=key)
    second = client.call(OCR, {"receipt_ids": ["rcpt-005"]}, idempotency_key=key)
    assert first.running and second.running
    assert first.job_id == second.job_id
    other = client.call(OCR, {"receipt_ids": ["rcpt-015"]}, idempotency_key=key)
    assert other.error is not None and other.error.code == "conflict"
    # In a batch too, the key names the same job.
    (batched,) = client.call_many([Call(OCR, {"receipt_ids": ["rcpt-005"]}, idempotency_key=key)])
    assert batched.job_id == first.job_id


def test_a_human_tool_opens_a_ticket_answered_from_the_inbox(client: Client) -> None:
    question = f"Is exp-020 travel or meals? ({uuid.uuid4()})"
    asked = client.call("ask_user", {"question": question, "options": ["travel", "meals"]})
    assert asked.suspended
    assert asked.ticket and asked.ticket.startswith("t_")
    assert asked.question == question and asked.options == ["travel", "meals"]

    inbox = client.inbox(state="open", kind="question")
    mine = [t for t in inbox["tickets"] if t["ticket"] == asked.ticket]
    assert len(mine) == 1 and mine[0]["question"] == question and mine[0]["state"] == "open"

    with pytest.raises(ToolfleetError) as wrong:
        client.answer_ticket(asked.ticket, "lodging")
    assert wrong.value.code == "invalid_arguments"

    answered = client.answer_ticket(asked.ticket, "travel")
    assert answered["state"] == "answered" and answered["answer"] == "travel"
    assert client.get_ticket(asked.ticket)["answer"] == "travel"
    assert asked.ticket not in [t["ticket"] for t in client.inbox(state="open")["tickets"]]

    with pytest.raises(ToolfleetError) as twice:
        client.answer_ticket(asked.ticket, "meals")
    assert twice.value.code == "conflict"
    assert twice.value.envelope is not None and twice.value.envelope["error"]["details"]


def test_a_command_dry_run_then_commit_with_its_token(client: Client) -> None:
    args = {"line_ids": ["exp-001", "exp-012"]}
    plan = client.call("submit_report", {**args, "dry_run": True})
    assert plan.ok, plan.raw
    assert plan.result["plan"]["lines"] == 2
    token = plan.result["confirm_token"]
    assert token.startswith("ct1.")

    unconfirmed = client.call("submit_report", {**args, "dry_run": False})
    assert unconfirmed.error is not None and unconfirmed.error.code == "confirm_required"
    forged = client.call("submit_report", {**args, "dry_run": False, "confirm_token": token[:-4] + "0000"})
    assert forged.error is not None and forged.error.code == "invalid_confirm_token"

    committed = client.call("submit_report", {**args, "dry_run": False, "confirm_token": token})
    assert committed.ok, committed.raw
    repeated = client.call("submit_report", {**args, "dry_run": False, "confirm_token": token})
    assert repeated.ok and repeated.result == committed.result


def test_events_announce_a_job_as_it_settles(client: Client) -> None:
    seen: list[SseEvent] = []
    stop = threading.Event()

    def listen() -> None:
        events = client.events(["queued", "succeeded"], read_timeout_s=30)
        for event in events:
            seen.append(event)
            if stop.is_set():
                break

    # Another client: httpx's client is not shared across threads here.
    with Client(client.base_url, client.token) as caller:
        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        made: list[str] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            started = caller.call(OCR, {"receipt_ids": ["rcpt-005"]})
            made.append(started.job_id or "")
            time.sleep(0.3)
            settled = [e for e in seen if e.id in made and e.json()["state"] == "succeeded"]
            if settled:
                break
        stop.set()
        caller.call(OCR, {"receipt_ids": ["rcpt-005"]})
    assert settled, f"no succeeded event among {len(seen)} events"
    event = settled[0]
    assert event.event == "job"
    data: dict[str, Any] = event.json()
    assert data["kind"] == "job" and data["tool"] == OCR and data["id"] == event.id
    assert data["body"]["status"] == "ok"
    assert data["body"]["result"]["receipts"][0]["receipt_id"] == "rcpt-005"
    assert {e.json()["state"] for e in seen} <= {"queued", "succeeded"}


def test_a_silent_stream_times_out_and_a_bad_filter_raises(client: Client) -> None:
    with pytest.raises(ToolfleetConnectionError) as silent:
        next(iter(client.events("cancelled", read_timeout_s=0.5)))
    assert silent.value.code == "timeout" and silent.value.retryable
    with pytest.raises(ToolfleetError) as bad:
        next(iter(client.events("finished")))
    assert bad.value.status == 400 and bad.value.code == "bad_request"
    with pytest.raises(ToolfleetError) as missing:
        next(iter(client.follow_run("run_00000000000000000000000000000000")))
    assert missing.value.code == "not_found"


def test_a_webhook_verifies_and_a_tampered_one_does_not(client: Client, hooks: HookReceiver) -> None:
    started = client.call(OCR, {"receipt_ids": ["rcpt-015"]}, callback_url=f"{hooks.url}/done")
    assert started.running
    hook = hooks.wait_for("/done")
    body = json.loads(hook.body)
    assert body["event"] == "job.succeeded" and body["job_id"] == started.job_id
    lowered = {k.lower(): v for k, v in hook.headers.items()}
    assert lowered.get("toolfleet-delivery")

    assert verify_webhook(WEBHOOK_SECRET, hook.headers, hook.body)
    titled = {"Content-Type": "application/json", "Toolfleet-Signature": lowered["toolfleet-signature"]}
    assert verify_webhook(WEBHOOK_SECRET.encode(), titled, hook.body.decode())
    assert not verify_webhook(WEBHOOK_SECRET, hook.headers, hook.body.replace(b"rcpt-015", b"rcpt-016"))
    assert not verify_webhook(WEBHOOK_SECRET, hook.headers, hook.body + b" ")
    assert not verify_webhook("another-key-0123456789abcdef0123456789", hook.headers, hook.body)
    assert not verify_webhook(WEBHOOK_SECRET, {}, hook.body)
    # An old signature is refused unless the tolerance is turned off.
    t = int(lowered["toolfleet-signature"].split(",")[0].removeprefix("t="))
    assert not verify_webhook(WEBHOOK_SECRET, hook.headers, hook.body, now=t + 3600)
    assert verify_webhook(WEBHOOK_SECRET, hook.headers, hook.body, now=t + 3600, tolerance_s=None)
    # The header is the one sign_webhook makes.
    assert sign_webhook(WEBHOOK_SECRET, t, hook.body) == lowered["toolfleet-signature"]


def test_the_signature_scheme_matches_the_servers_vector() -> None:
    # HMAC-SHA256("key", "1.{}"), as crates/server/src/webhooks.rs tests it.
    header = "t=1,v1=1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224"
    assert sign_webhook("key", 1, "{}") == header
    assert verify_webhook("key", {"Toolfleet-Signature": header}, b"{}", tolerance_s=None)
    assert not verify_webhook("key", {"Toolfleet-Signature": header}, b"{} ", tolerance_s=None)
    assert not verify_webhook("key", {"Toolfleet-Signature": "t=1"}, b"{}", tolerance_s=None)
    assert not verify_webhook("key", {"Toolfleet-Signature": "v1=00,t=x"}, b"{}", tolerance_s=None)


def test_a_bad_token_raises_with_its_envelope(server: Server) -> None:
    with Client(server.base_url, "tf_not_a_token") as stranger:
        with pytest.raises(ToolfleetError) as raised:
            stranger.call("find_expenses", {"month": "2026-09"})
    error = raised.value
    assert error.status == 401
    assert error.code == "unauthenticated"
    assert error.envelope is not None and error.envelope["status"] == "error"
    assert error.message == error.envelope["error"]["message"]
    assert error.retryable is False
    with Client(server.base_url) as anonymous:
        with pytest.raises(ToolfleetError) as none:
            anonymous.tools()
    assert none.value.status == 401


def test_a_server_that_is_not_there_raises_unavailable() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", "t") as nobody:
        with pytest.raises(ToolfleetError) as raised:
            nobody.tools()
    assert raised.value.code == "unavailable" and raised.value.status is None


def test_a_client_of_ones_own_gets_the_root_and_the_token(server: Server) -> None:
    import httpx

    seen: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [seen.append]})
    with Client(server.base_url, server.token, http=http) as tf:
        assert tf.call("find_expenses", {"month": "2026-09"}).ok
    assert str(seen[0].url) == f"{server.base_url}/v1/calls"
    assert seen[0].headers["authorization"] == f"Bearer {server.token}"
    assert http.is_closed
