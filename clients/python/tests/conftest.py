"""A real `toolfleet serve` for the tests, and a scripted model for its
expense assistant.

The binary is the one `TOOLFLEET_BIN` names (the Rust test passes the one
cargo built), else the repository's `target/release` or `target/debug`
build, else `toolfleet` on the PATH. It runs in a temporary directory on the repository's expense
pack, listening on a port the kernel picks, with no `[[auth.tokens]]`, so
it makes a development token; webhooks may reach any port of 127.0.0.1 and
are signed with `WEBHOOK_SECRET`. The assistant's model is a small
OpenAI-compatible server here (`ScriptedChat`), named by
`EXPENSES_MODEL_URL`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "clients" / "python" / "src"))

from toolfleet import AsyncClient, Client  # noqa: E402

WEBHOOK_SECRET = "python-client-webhook-key-0123456789abcdef"
PACK = REPO / "examples" / "expenses" / "toolfleet.toml"


def chat_reply(request: dict[str, Any]) -> dict[str, Any]:
    """The scripted assistant: reads the conversation, answers the next step.

    An input that asks to submit makes the `submit_report` dry run, then the
    commit with the dry run's confirm token, then answers with the commit's
    outcome; any other input lists the month's lines, then answers with how
    many the first page had."""
    messages = request["messages"]
    user = [m for m in messages if m["role"] == "user"][-1]["content"]
    step = len([m for m in messages if m["role"] == "assistant"])
    if messages[-1]["role"] == "user":
        if "submit" in user:
            return _calls(step, "submit_report", {"line_ids": ["exp-001"], "dry_run": True})
        return _calls(step, "find_expenses", {"month": "2026-09"})
    # A tool's result: an ok one's `result`, an error as `ERROR: {"error": ...}`.
    last = json.loads(messages[-1]["content"].removeprefix("ERROR: "))
    error = last.get("error") if isinstance(last.get("error"), dict) else None
    if "submit" in user and "plan" in last and "confirm_token" in last:
        token = last["confirm_token"]
        return _calls(step, "submit_report", {"line_ids": ["exp-001"], "dry_run": False, "confirm_token": token})
    if "submit" in user:
        return _answer(f"The report came to: {error['code'] if error else 'ok'}.")
    return _answer(f"September has {len(last.get('lines', []))} lines on its first page.")


def _calls(step: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return _completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"call_{step}_0", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        },
        "tool_calls",
    )


def _answer(text: str) -> dict[str, Any]:
    return _completion({"role": "assistant", "content": text}, "stop")


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
    }


class ScriptedChat:
    """An OpenAI Chat Completions server on 127.0.0.1 answering `chat_reply`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        chat = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", "0"))
                request = json.loads(self.rfile.read(length))
                chat.requests.append(request)
                body = json.dumps(chat_reply(request)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Hook:
    """One webhook as it arrived."""

    path: str
    headers: dict[str, str]
    body: bytes


class HookReceiver:
    """Records every POST on 127.0.0.1, answering 204."""

    def __init__(self) -> None:
        self.hooks: list[Hook] = []
        self.lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                with receiver.lock:
                    receiver.hooks.append(Hook(self.path, dict(self.headers.items()), body))
                    receiver.lock.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait_for(self, path: str, timeout_s: float = 20.0) -> Hook:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while True:
                for hook in self.hooks:
                    if hook.path == path:
                        return hook
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no webhook to {path} within {timeout_s} s: {self.hooks}")
                self.lock.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Server:
    base_url: str
    token: str
    data_dir: Path
    model: ScriptedChat


def toolfleet_binary() -> str:
    """`TOOLFLEET_BIN`, else the repository's release or debug build, else
    `toolfleet` on the PATH."""
    named = os.environ.get("TOOLFLEET_BIN")
    if named:
        return named
    for build in ("release", "debug"):
        candidate = REPO / "target" / build / "toolfleet"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("toolfleet")
    if found:
        return found
    pytest.fail("no toolfleet binary: set TOOLFLEET_BIN (cargo test -p toolfleet --test python_client does)")


@pytest.fixture(scope="session")
def model() -> Iterator[ScriptedChat]:
    chat = ScriptedChat()
    yield chat
    chat.close()


@pytest.fixture(scope="session")
def server(model: ScriptedChat, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    binary = toolfleet_binary()
    directory = tmp_path_factory.mktemp("toolfleet")
    config = directory / "toolfleet.toml"
    config.write_text(
        f"""listen = "127.0.0.1:0"
data_dir = "{directory / "data"}"
include = ["{PACK}"]

[webhooks]
allow = ["127.0.0.1:*"]
secret = "{WEBHOOK_SECRET}"
""",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["EXPENSES_MODEL_URL"] = model.url
    env["TOOLFLEET_LOG"] = "warn"
    process = subprocess.Popen(
        [binary, "--config", str(config), "serve"],
        cwd=directory,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    base = None
    assert process.stderr is not None
    for line in process.stderr:
        said.append(line.rstrip())
        found = re.match(r"toolfleet serving on (\S+)", line)
        if found:
            base = found.group(1)
            break
    if base is None:
        process.kill()
        pytest.fail("toolfleet serve exited before serving:\n" + "\n".join(said))
    stderr = process.stderr
    # Keep draining stderr so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
    token = (directory / "data" / "dev-token").read_text().strip()
    assert any(token in line for line in said), "serve prints the token it made"
    yield Server(base_url=base, token=token, data_dir=directory / "data", model=model)
    process.kill()
    process.wait()


@pytest.fixture()
def client(server: Server) -> Iterator[Client]:
    with Client(server.base_url, server.token) as c:
        yield c


@pytest.fixture()
def make_async(server: Server) -> Any:
    def make() -> AsyncClient:
        return AsyncClient(server.base_url, server.token)

    return make


@pytest.fixture()
def hooks() -> Iterator[HookReceiver]:
    receiver = HookReceiver()
    yield receiver
    receiver.close()
