"""`AsyncClient` does what `Client` does, against the same server."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from typing import Any, Callable

import pytest
from toolfleet import AsyncClient, Client, Envelope, ToolfleetError

OCR = "start_receipt_ocr"


def test_both_clients_have_the_same_methods() -> None:
    def public(cls: type) -> dict[str, list[str]]:
        return {
            name: list(inspect.signature(member).parameters)
            for name, member in vars(cls).items()
            if callable(member) and not name.startswith("_") and name not in ("close", "aclose")
        }

    assert public(Client) == public(AsyncClient)
    for name, member in vars(AsyncClient).items():
        if name in ("events", "follow_run") or name.startswith("_") or not callable(member):
            continue
        assert inspect.iscoroutinefunction(member), name


def test_async_calls_jobs_batches_and_errors(make_async: Callable[[], AsyncClient]) -> None:
    async def main() -> None:
        async with make_async() as tf:
            assert {t["name"] for t in await tf.tools("anthropic")} >= {"find_expenses", OCR}
            page = await tf.call("find_expenses", {"month": "2026-09"})
            assert page.ok and len(page.result["lines"]) == 50
            bad = await tf.call("find_expenses", {"month": "09/2026"})
            assert bad.error is not None and bad.error.code == "invalid_arguments"

            started = await tf.call(OCR, {"receipt_ids": ["rcpt-005"]}, idempotency_key=f"a-{uuid.uuid4()}")
            assert started.running
            done = await tf.wait_job(started.job_id or "", timeout_s=30)
            assert done.ok and done.result["receipts"][0]["receipt_id"] == "rcpt-005"
            assert (await tf.get_job(started.job_id or "", wait_s=1)).result == done.result

            results = await tf.call_many([("find_expenses", {"month": "2026-10"}), (OCR, {"receipt_ids": ["rcpt-015"]})])
            assert [r.status for r in results] == ["ok", "running"]
            waited = await tf.call_and_wait(OCR, {"receipt_ids": ["rcpt-025"]}, timeout_s=30)
            assert waited.ok

            with pytest.raises(ToolfleetError) as missing:
                await tf.get_job(str(uuid.uuid4()))
            assert missing.value.code == "not_found"

        async with AsyncClient(tf.base_url, "tf_nobody") as stranger:
            with pytest.raises(ToolfleetError) as raised:
                await stranger.call("find_expenses", {"month": "2026-09"})
            assert raised.value.status == 401 and raised.value.code == "unauthenticated"

    asyncio.run(main())


def test_async_tickets_and_runs(make_async: Callable[[], AsyncClient]) -> None:
    async def main() -> None:
        async with make_async() as tf:
            asked = await tf.call("ask_user", {"question": f"Which? {uuid.uuid4()}", "options": ["a", "b"]})
            assert asked.suspended and asked.ticket
            inbox = await tf.inbox(state="open")
            assert asked.ticket in [t["ticket"] for t in inbox["tickets"]]
            answered = await tf.answer_ticket(asked.ticket, "b")
            assert answered["answer"] == "b"

            run = await tf.start_run("expense_assistant", "How many lines?")
            states = []
            async for event in tf.follow_run(run["run_id"], read_timeout_s=30):
                states.append(event.json()["state"])
                if states[-1] == "answered":
                    break
            assert states[-1] == "answered"
            done = await tf.wait_run_settled(run["run_id"], timeout_s=10)
            assert done["answer"] == "September has 50 lines on its first page."

            driven = await tf.start_run(checkpoint={"n": 1})
            answered_run = await tf.answer_run(driven["run_id"], "fine")
            assert answered_run["state"] == "answered"
            assert (await tf.cancel_run(driven["run_id"]))["state"] in ("answered", "cancelled")

    asyncio.run(main())


def test_async_events_see_a_job_settle(make_async: Callable[[], AsyncClient]) -> None:
    async def main() -> Any:
        async with make_async() as listener, make_async() as caller:
            made: list[str] = []

            async def listen() -> Any:
                async for event in listener.events("succeeded", read_timeout_s=30):
                    if event.id in made:
                        return event.json()
                return None

            task = asyncio.create_task(listen())
            for _ in range(60):
                started: Envelope = await caller.call(OCR, {"receipt_ids": ["rcpt-045"]})
                made.append(started.job_id or "")
                done, _ = await asyncio.wait({task}, timeout=0.3)
                if done:
                    break
            return await asyncio.wait_for(task, 10)

    seen = asyncio.run(main())
    assert seen["state"] == "succeeded" and seen["tool"] == OCR
    assert seen["body"]["result"]["receipts"][0]["receipt_id"] == "rcpt-045"
