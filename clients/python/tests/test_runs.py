"""Runs, of the expense assistant (its model scripted in conftest.py) and
driven by the caller, and approvals from the inbox."""

from __future__ import annotations

import time
from typing import Any

import pytest

from toolfleet import Client, Ticket, ToolfleetError

OCR = "start_receipt_ocr"


def _until(what: str, check: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s} s")
        time.sleep(0.1)


def test_an_assistants_run_answers_and_takes_another_message(client: Client) -> None:
    run = client.start_run("expense_assistant", "How many lines has September?")
    assert run["run_id"].startswith("run_") and run["agent"] == "expense_assistant"

    events = client.follow_run(run["run_id"], read_timeout_s=30)
    states = []
    for event in events:
        assert event.event.startswith("run.")
        data = event.json()
        states.append(data["state"])
        if data["state"] == "answered":
            break
    assert states[-1] == "answered"

    done = client.get_run(run["run_id"])
    assert done["answer"] == "September has 50 lines on its first page."
    calls = [e for e in done["transcript"] if e["type"] == "tool_call"]
    assert [c["tool"] for c in calls] == ["find_expenses"]
    assert calls[0]["envelope"]["status"] == "ok"
    assert run["run_id"] in [r["run_id"] for r in client.list_runs(agent="expense_assistant")["runs"]]

    client.message_run(run["run_id"], "And again, please?")
    again = client.wait_run_settled(run["run_id"], timeout_s=30)
    assert again["state"] == "answered"
    users = [e["content"] for e in again["transcript"] if e["type"] == "user"]
    assert users == ["How many lines has September?", "And again, please?"]
    assert len([e for e in again["transcript"] if e["type"] == "tool_call"]) == 2

    with pytest.raises(ToolfleetError) as waiting:
        client.wait_run(run["run_id"], jobs=["x"])
    assert waiting.value.code in ("conflict", "not_found", "invalid_arguments")


def _approval_of(client: Client, run_id: str) -> Ticket:
    def find() -> Ticket | None:
        tickets = client.inbox(state="open", kind="approval")["tickets"]
        return next((t for t in tickets if t["run_id"] == run_id), None)

    return _until("an approval ticket", find)  # type: ignore[no-any-return]


def test_an_approved_commit_runs_once_and_the_run_answers(client: Client) -> None:
    run = client.start_run("expense_assistant", "Please submit exp-001.")
    ticket = _approval_of(client, run["run_id"])
    assert ticket["kind"] == "approval" and ticket["tool"] == "submit_report"
    assert ticket["plan"]["lines"] == 1
    assert client.get_run(run["run_id"])["state"] == "waiting"

    approved = client.approve(ticket["ticket"])
    assert approved["state"] == "answered"
    assert approved["outcome"]["status"] == "ok"
    done = client.wait_run_settled(run["run_id"], timeout_s=30)
    assert done["state"] == "answered", done
    assert done["answer"] == "The report came to: ok."

    with pytest.raises(ToolfleetError) as twice:
        client.approve(ticket["ticket"])
    assert twice.value.code in ("conflict", "invalid_arguments")


def test_a_rejected_commit_reaches_the_run_as_rejected(client: Client) -> None:
    run = client.start_run("expense_assistant", "Please submit exp-001 now.")
    ticket = _approval_of(client, run["run_id"])
    rejected = client.reject(ticket["ticket"], reason="not this month")
    assert rejected["outcome"]["error"]["code"] == "rejected"
    assert rejected["outcome"]["error"]["details"]["reason"] == "not this month"
    done = client.wait_run_settled(run["run_id"], timeout_s=30)
    assert done["answer"] == "The report came to: rejected."


def test_a_run_the_caller_drives_parks_on_its_job_and_resumes(client: Client) -> None:
    run = client.start_run(checkpoint={"step": 1}, idempotency_key=f"py-run-{time.time_ns()}")
    run_id = run["run_id"]
    assert run["state"] == "running" and run["agent"] is None

    started = client.call(OCR, {"receipt_ids": ["rcpt-005"]}, run_id=run_id)
    asked = client.call("ask_user", {"question": "Travel or meals?", "options": ["travel", "meals"]}, run_id=run_id)
    assert started.running and asked.suspended
    parked = client.wait_run(run_id, jobs=[started.job_id or ""], tickets=[asked.ticket or ""], checkpoint={"step": 2})
    assert parked["state"] in ("waiting", "running")

    client.answer_ticket(asked.ticket or "", "meals")
    resumed = _until("the run resumed", lambda: (r := client.get_run(run_id))["resumed"] and r)
    assert resumed["state"] == "running"
    assert resumed["resumed"]["checkpoint"] == {"step": 2}
    items = {item["kind"]: item for item in resumed["resumed"]["items"]}
    assert items["job"]["id"] == started.job_id and items["job"]["envelope"]["status"] == "ok"
    assert items["ticket"]["envelope"]["result"]["answer"] == "meals"

    answered = client.answer_run(run_id, "Done: one receipt read.", checkpoint={"step": 3})
    assert answered["state"] == "answered" and answered["answer"] == "Done: one receipt read."

    # The same key answers the same run.
    other = client.start_run(checkpoint={"step": 1}, idempotency_key=f"py-same-{run_id}")
    same = client.start_run(checkpoint={"step": 1}, idempotency_key=f"py-same-{run_id}")
    assert other["run_id"] == same["run_id"]
    cancelled = client.cancel_run(other["run_id"])
    assert cancelled["state"] == "cancelled"


def test_an_unknown_assistant_raises(client: Client) -> None:
    with pytest.raises(ToolfleetError) as raised:
        client.start_run("nobody", "hi")
    assert raised.value.code == "invalid_arguments"
    assert "expense_assistant" in raised.value.message


def test_waiting_for_a_run_that_does_not_settle_ends_at_its_timeout(client: Client, make_async: Any) -> None:
    import asyncio

    run = client.start_run(checkpoint={})
    later = client.call(OCR, {"receipt_ids": ["rcpt-005"]}, run_id=run["run_id"], delay_s=600)
    parked = client.wait_run(run["run_id"], jobs=[later.job_id or ""])
    assert parked["state"] == "waiting"

    started = time.monotonic()
    still = client.wait_run_settled(run["run_id"], timeout_s=1.5)
    assert still["state"] == "waiting"
    assert time.monotonic() - started < 10

    async def main() -> Any:
        async with make_async() as tf:
            return await tf.wait_run_settled(run["run_id"], timeout_s=1.5)

    started = time.monotonic()
    assert asyncio.run(main())["state"] == "waiting"
    assert time.monotonic() - started < 10

    # Cancelling the run cancels the job it waits on.
    assert client.cancel_run(run["run_id"])["state"] == "cancelled"
    assert client.get_job(later.job_id or "").state == "cancelled"
