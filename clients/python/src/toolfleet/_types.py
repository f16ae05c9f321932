"""The JSON objects the client answers for runs, tickets and the lists, as
`TypedDict`s: plain dicts at run time (index them as before), typed for a
checker.

Each type is a schema of the OpenAPI document (`GET /v1/openapi.json`,
`components/schemas`, made by crates/server/src/openapi.rs) with exactly
its properties: a required property is a key of the type, an optional one
(absent from `required`) a key of its `total=False` part, which is how
`NotRequired` is spelt on Python 3.10 without `typing_extensions`.
tests/test_types.py holds each type to the schema of the running server.

String enums (`state`, `kind`, `for`) are typed `str`: a server newer than
the client may send a value it does not know. Properties the document
leaves untyped (a run's `error`, `usage`, `checkpoint`, `resumed`; a
ticket's `plan`, `answer`, `outcome`) are `Any`.
"""

from typing import Any, Literal, TypedDict

__all__ = [
    "JobPage",
    "JobSummary",
    "Run",
    "RunPage",
    "RunWait",
    "Ticket",
    "TicketPage",
    "TicketScope",
    "TranscriptEntry",
]

#: One entry of a run's transcript: `at`, `type` (`user`, `model`,
#: `tool_call`, `tool_result`, `wait`, `resume`...) and that type's fields.
#: The document gives it no properties (`{"type": "object"}`), so neither
#: does the client.
TranscriptEntry = dict[str, Any]


class JobSummary(TypedDict):
    """One job of `list_jobs` (schema `JobSummary`). Times are Unix
    milliseconds."""

    job_id: str
    tool: str
    #: `queued`, `scheduled`, `running`, `retrying`, `succeeded`, `failed`
    #: or `cancelled`.
    state: str
    attempts: int
    run_id: str
    run_at: int | None
    priority: int | None
    created_at: int
    updated_at: int


class JobPage(TypedDict):
    """`list_jobs` (schema `JobPage`): newest first; `next_cursor` is `None`
    on the last page."""

    jobs: list[JobSummary]
    next_cursor: str | None


class TicketScope(TypedDict):
    """A ticket's `answered_by` when holders of a scope answer it."""

    scope: str


class _TicketRequired(TypedDict):
    ticket: str
    tool: str
    question: str
    options: list[str]
    #: `open`, `answered` or `expired`.
    state: str
    #: `question`, `approval` or `input`.
    kind: str
    answered_by: Literal["caller"] | TicketScope
    run_id: str
    created_at: int


class Ticket(_TicketRequired, total=False):
    """A ticket (schema `Ticket`): of `get_ticket`, `answer_ticket`,
    `approve`, `reject` and the inbox."""

    #: An approval's: what the command's dry run answered.
    plan: Any
    #: An input ticket's: what a job tool asks its caller's MCP client, by
    #: key.
    input_requests: dict[str, Any]
    #: An input ticket's keys not answered yet.
    pending: list[str]
    #: The answer, once given.
    answer: Any
    #: The envelope it came to, once it did.
    outcome: Any
    answered_at: int | None
    expires_at: int | None


class TicketPage(TypedDict):
    """`inbox` (schema `TicketPage`): newest first, 50 a page."""

    tickets: list[Ticket]
    next_cursor: str | None


#: What a `waiting` run waits on (the `wait` of schema `Run`); `for` is
#: `all` or `any`. A class cannot name a key `for`, hence this form.
RunWait = TypedDict("RunWait", {"for": str, "jobs": list[str], "tickets": list[str]})


class _RunRequired(TypedDict):
    run_id: str
    agent: str | None
    #: `running`, `waiting`, `answered`, `failed`, `budget_exceeded` or
    #: `cancelled`.
    state: str
    wait: RunWait | None
    answer: str | None
    #: When `failed` or `budget_exceeded`.
    error: Any
    #: An assistant's steps, tokens and wall time.
    usage: Any
    #: A run the caller drives: its checkpoint.
    checkpoint: Any
    #: `{"checkpoint", "items"}` once a wait resumed.
    resumed: Any
    callback_url: str | None
    version: int
    created_at: int
    updated_at: int


class Run(_RunRequired, total=False):
    """A run (schema `Run`): of `start_run`, `get_run`, `wait_run`,
    `wait_run_settled`, `message_run`, `answer_run` and `cancel_run`.
    `transcript` is there when the run is read on its own (`get_run`,
    `wait_run_settled`), not in `list_runs`."""

    transcript: list[TranscriptEntry]


class RunPage(TypedDict):
    """`list_runs` (schema `RunPage`): newest first, 50 a page, without
    transcripts."""

    runs: list[Run]
    next_cursor: str | None
