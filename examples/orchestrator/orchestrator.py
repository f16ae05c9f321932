#!/usr/bin/env python3
"""Drive a toolfleet run from outside: "A run the caller drives" (docs/API.md).

This script keeps its own message list and its own model loop, against any
OpenAI-compatible chat completions server. toolfleet keeps the rest: the
tools and their one call path, the jobs, the tickets people answer, and,
while the run waits, its checkpoint. The loop:

1. Start a run with POST /v1/runs {"checkpoint", "callback_url"}; the
   callback URL is a small HTTP server this script runs in a thread.
2. Send the messages and the tools (GET /v1/tools?format=openai) to the model.
3. Make each tool call of its reply through POST /v1/calls with the run's
   run_id. `ok` and `error` envelopes become tool messages at once; `running`
   (a job) and `suspended` (a ticket: a question or an approval) are awaited.
4. If any is awaited, park the run: POST /v1/runs/{run}/wait with the jobs,
   the tickets and a checkpoint of the messages and the calls awaited. Then
   wait for the callback's `run.resumed`: restore the messages from its
   checkpoint and append each awaited item's final envelope as the tool
   message of its call.
5. Repeat until the model answers without tool calls; record the answer with
   POST /v1/runs/{run}/answer and print `ANSWER: ...`
   as the last line and exit 0.

Exit codes: 0 answered; 1 a request failed or toolfleet answered an error;
2 a wait timed out; 3 the model did not answer within --max-steps.

Needs Python 3.9+ and httpx only.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.server
import json
import os
import queue
import sys
import threading
import time
from typing import Any

import httpx

SYSTEM_PROMPT = (
    "You help a user with their expenses through tools. List a month's lines "
    "with find_expenses (every page), read receipts of lines without an amount "
    "with start_receipt_ocr, ask the user with ask_user what no tool can tell, "
    "and submit with submit_report: first dry_run=true, then dry_run=false with "
    "the confirm_token of the plan. Answer in one short paragraph."
)

# How far a signature's time may be from ours (a retry signs anew).
SIGNATURE_TOLERANCE_S = 300


def log(message: str) -> None:
    """Progress goes to stderr, so stdout ends with the answer."""
    print(message, file=sys.stderr, flush=True)


class Failure(Exception):
    """A failure that ends the run with an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def signature_ok(secret: bytes, header: str | None, body: bytes, now: float) -> bool:
    """Toolfleet-Signature: t=<unix s>,v1=<hex HMAC-SHA256 of "<t>.<body>">."""
    if not header:
        return False
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    t, v1 = parts.get("t", ""), parts.get("v1", "")
    if not t.isdigit() or abs(now - int(t)) > SIGNATURE_TOLERANCE_S:
        return False
    expected = hmac.new(secret, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, v1)


class Callbacks:
    """The run's callback_url: an HTTP server in a thread that queues the
    notices it receives, each once."""

    def __init__(self, host: str, port: int, secret: bytes | None) -> None:
        self.notices: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: set[tuple[Any, ...]] = set()
        self.lock = threading.Lock()
        callbacks = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server name)
                length = int(self.headers.get("Content-Length") or 0)
                if length > 8 << 20:
                    self.send_response(413)
                    self.end_headers()
                    return
                body = self.rfile.read(length)
                header = self.headers.get("Toolfleet-Signature")
                if secret is not None and not signature_ok(secret, header, body, time.time()):
                    self.send_response(401)
                    self.end_headers()
                    return
                try:
                    notice = json.loads(body)
                except ValueError:
                    self.send_response(400)
                    self.end_headers()
                    return
                self.send_response(204)
                self.end_headers()
                if isinstance(notice, dict):
                    callbacks.receive(notice, self.headers.get("Toolfleet-Delivery"))

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/toolfleet"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def receive(self, notice: dict[str, Any], delivery: str | None) -> None:
        # A repeat carries the same Toolfleet-Delivery and the same body; the
        # run's version tells two resumes of one run apart.
        key = (delivery, notice.get("event"), notice.get("run_id"), notice.get("version"))
        with self.lock:
            if key in self.seen:
                return
            self.seen.add(key)
        self.notices.put(notice)


class Orchestrator:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.toolfleet = httpx.Client(
            base_url=args.server.rstrip("/"),
            headers={"Authorization": f"Bearer {args.token}"},
            timeout=httpx.Timeout(30.0),
        )
        model_headers = {"Authorization": f"Bearer {args.model_key}"} if args.model_key else {}
        self.model = httpx.Client(headers=model_headers, timeout=httpx.Timeout(args.model_timeout_s))

    # toolfleet

    def request(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = self.toolfleet.request(method, path, json=body)
        except httpx.HTTPError as error:
            raise Failure(f"{method} {path} failed: {error}") from error
        try:
            return response.json()
        except ValueError as error:
            raise Failure(f"{method} {path} answered {response.status_code} with a body that is not JSON") from error

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        """The `result` of an `ok` envelope; anything else is a failure."""
        envelope = self.request(method, path, body)
        if not isinstance(envelope, dict) or envelope.get("status") != "ok":
            raise Failure(f"{method} {path} answered {json.dumps(envelope)[:500]}")
        return envelope.get("result")

    def call(self, run_id: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        try:
            args = json.loads(arguments or "{}")
        except ValueError as error:
            # The model's own mistake: tell it, as toolfleet would.
            return {"status": "error", "error": {"code": "invalid_arguments", "retryable": False,
                    "message": f"the arguments of `{name}` are not JSON ({error}); call again with a JSON object"}}
        # The same call of the same run is the same job, should this be retried.
        key = hashlib.sha256(f"{run_id}\n{call_id}".encode()).hexdigest()
        body = {"tool": name, "args": args, "run_id": run_id, "idempotency_key": key}
        envelope = self.request("POST", "/v1/calls", body)
        if not isinstance(envelope, dict) or "status" not in envelope:
            raise Failure(f"POST /v1/calls answered {json.dumps(envelope)[:500]}")
        return envelope

    # the model

    def complete(self, messages: list[dict[str, Any]], tools: list[Any]) -> dict[str, Any]:
        url = self.args.model_url.rstrip("/") + "/chat/completions"
        body: dict[str, Any] = {"model": self.args.model, "messages": messages}
        if tools:
            body["tools"] = tools
        try:
            response = self.model.post(url, json=body)
            response.raise_for_status()
            return response.json()["choices"][0]["message"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
            raise Failure(f"the model at {url} failed: {error}") from error

    # the loop

    def run(self) -> str:
        tools = self.ok_list("/v1/tools?format=openai")
        callbacks = Callbacks(self.args.callback_host, self.args.callback_port, self.args.secret)
        callbacks.start()
        try:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": self.args.system},
                {"role": "user", "content": self.args.input},
            ]
            run = self.ok("POST", "/v1/runs", {
                "checkpoint": {"messages": messages, "pending": []},
                "callback_url": callbacks.url,
            })
            run_id = run["run_id"]
            log(f"run {run_id} (callbacks at {callbacks.url})")
            for step in range(1, self.args.max_steps + 1):
                reply = self.complete(messages, tools)
                calls = reply.get("tool_calls") or []
                if not calls:
                    answer = reply.get("content") or ""
                    # The run records the answer: `answered`, run.answered to its callback.
                    self.ok("POST", f"/v1/runs/{run_id}/answer", {
                        "answer": answer,
                        "checkpoint": {"messages": messages + [{"role": "assistant", "content": answer}], "pending": []},
                    })
                    return answer
                messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": calls})
                pending: list[dict[str, str]] = []
                for call in calls:
                    function = call.get("function") or {}
                    name = function.get("name", "")
                    envelope = self.call(run_id, call["id"], name, function.get("arguments", "{}"))
                    status = envelope["status"]
                    log(f"step {step}: {name} -> {status}")
                    if status == "running" and envelope.get("job_id"):
                        pending.append({"tool_call_id": call["id"], "kind": "job", "id": envelope["job_id"]})
                    elif status == "suspended" and envelope.get("ticket"):
                        pending.append({"tool_call_id": call["id"], "kind": "ticket", "id": envelope["ticket"]})
                        log(f"  waiting on ticket {envelope['ticket']}: {envelope.get('question', '')} "
                            f"options={envelope.get('options', [])} (toolfleet answer / approve / reject)")
                    else:
                        messages.append(tool_message(call["id"], envelope))
                if pending:
                    messages = self.wait(callbacks, run_id, messages, pending)
            raise Failure(f"no answer within {self.args.max_steps} steps", 3)
        finally:
            callbacks.stop()

    def ok_list(self, path: str) -> list[Any]:
        specs = self.request("GET", path)
        if not isinstance(specs, list):
            raise Failure(f"GET {path} answered {json.dumps(specs)[:500]}")
        return specs

    def wait(self, callbacks: Callbacks, run_id: str, messages: list[dict[str, Any]],
             pending: list[dict[str, str]]) -> list[dict[str, Any]]:
        """Parks the run on its pending calls; answers the messages of the
        checkpoint it resumed with, each awaited call's tool message added."""
        self.ok("POST", f"/v1/runs/{run_id}/wait", {
            "for": "all",
            "jobs": [p["id"] for p in pending if p["kind"] == "job"],
            "tickets": [p["id"] for p in pending if p["kind"] == "ticket"],
            "checkpoint": {"messages": messages, "pending": pending},
        })
        awaited = {p["id"] for p in pending}
        log(f"  run {run_id} waits on {sorted(awaited)}")
        deadline = time.monotonic() + self.args.wait_timeout_s
        resumed = None
        while resumed is None:
            left = deadline - time.monotonic()
            if left <= 0:
                # The callback may have been lost: the run itself says.
                run = self.ok("GET", f"/v1/runs/{run_id}")
                if run.get("state") == "running" and covers(run.get("resumed"), awaited):
                    log(f"  no run.resumed reached {callbacks.url}; the run had resumed")
                    resumed = run["resumed"]
                    break
                raise Failure(f"run {run_id} did not resume within {self.args.wait_timeout_s} s "
                              f"(state {run.get('state')})", 2)
            try:
                notice = callbacks.notices.get(timeout=left)
            except queue.Empty:
                continue
            if notice.get("run_id") != run_id or notice.get("event") != "run.resumed":
                continue
            # A late repeat of an earlier resume names other items.
            if covers(notice.get("resumed"), awaited):
                resumed = notice["resumed"]
                log(f"  heard run.resumed of {run_id} (version {notice.get('version')})")
        return restore(resumed)


def covers(resumed: Any, awaited: set[str]) -> bool:
    """Whether a `resumed` holds the items of this wait."""
    if not isinstance(resumed, dict):
        return False
    ids = {item.get("id") for item in resumed.get("items") or [] if isinstance(item, dict)}
    return awaited <= ids


def tool_message(call_id: str, envelope: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(envelope)}


def restore(resumed: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages of the checkpoint, and the tool message of each call it
    awaited: the final envelope of its job or ticket."""
    checkpoint = resumed.get("checkpoint") or {}
    messages = list(checkpoint.get("messages") or [])
    envelopes = {item.get("id"): item.get("envelope") for item in resumed.get("items") or []}
    for item in checkpoint.get("pending") or []:
        envelope = envelopes.get(item["id"])
        if envelope is None:
            envelope = {"status": "error", "error": {"code": "not_found", "retryable": False,
                        "message": f"the run resumed without the outcome of {item['kind']} {item['id']}"}}
        messages.append(tool_message(item["tool_call_id"], envelope))
    return messages


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Drive a toolfleet run with your own model loop.")
    parser.add_argument("--server", default=os.environ.get("TOOLFLEET_URL", "http://127.0.0.1:8080"),
                        help="toolfleet's base URL (TOOLFLEET_URL)")
    parser.add_argument("--token", default=os.environ.get("TOOLFLEET_TOKEN"),
                        help="toolfleet bearer token (TOOLFLEET_TOKEN)")
    parser.add_argument("--model-url", default=os.environ.get("MODEL_URL"), required="MODEL_URL" not in os.environ,
                        help="an OpenAI-compatible base URL: POST {url}/chat/completions (MODEL_URL)")
    parser.add_argument("--model", default=os.environ.get("MODEL", "llama3.1"), help="the model's name (MODEL)")
    parser.add_argument("--model-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="the model server's bearer key, if it needs one (OPENAI_API_KEY)")
    parser.add_argument("--model-timeout-s", type=float, default=120.0)
    parser.add_argument("--callback-host", default="127.0.0.1",
                        help="where toolfleet reaches the callback server (its allow-list must open it)")
    parser.add_argument("--callback-port", type=int, default=9000, help="0 picks a free port")
    parser.add_argument("--webhook-secret", default=os.environ.get("TOOLFLEET_WEBHOOK_SECRET"),
                        help="check Toolfleet-Signature with this secret (TOOLFLEET_WEBHOOK_SECRET)")
    parser.add_argument("--input", required=True, help="the user's message")
    parser.add_argument("--system", default=SYSTEM_PROMPT, help="the system prompt")
    parser.add_argument("--max-steps", type=int, default=12, help="model replies at most")
    parser.add_argument("--wait-timeout-s", type=float, default=120.0, help="how long one wait may last")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("no token: pass --token or set TOOLFLEET_TOKEN")
    args.secret = args.webhook_secret.encode() if args.webhook_secret else None
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    try:
        answer = Orchestrator(args).run()
    except Failure as failure:
        log(f"orchestrator: {failure}")
        return failure.code
    print("ANSWER: " + " ".join(answer.split()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
