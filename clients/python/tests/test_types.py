"""The `TypedDict`s of runs, tickets and the lists cannot drift from the
server: each has exactly the properties of its schema in the running
server's OpenAPI document (`GET /v1/openapi.json`), required as the schema
requires them; each method answers the schema its route's 200 names; and
what the server answers has the keys the types say."""

from __future__ import annotations

import inspect
import typing
import uuid
from typing import Any, Iterator

import httpx
import pytest
from conftest import Server

import toolfleet
from toolfleet import (
    AsyncClient,
    Client,
    JobPage,
    JobSummary,
    Run,
    RunPage,
    RunWait,
    Ticket,
    TicketPage,
    TicketScope,
)

OCR = "start_receipt_ocr"
REF = "#/components/schemas/"

#: Each type and where its schema is in the document: a component, or the
#: object member of a component's nullable or alternative property.
SCHEMAS: dict[Any, tuple[str, ...]] = {
    JobSummary: ("JobSummary",),
    JobPage: ("JobPage",),
    Ticket: ("Ticket",),
    TicketScope: ("Ticket", "answered_by"),
    TicketPage: ("TicketPage",),
    Run: ("Run",),
    RunWait: ("Run", "wait"),
    RunPage: ("RunPage",),
}

#: Each method answering a typed dict, and its route.
ROUTES: dict[str, tuple[str, str]] = {
    "list_jobs": ("get", "/v1/jobs"),
    "start_run": ("post", "/v1/runs"),
    "list_runs": ("get", "/v1/runs"),
    "get_run": ("get", "/v1/runs/{run}"),
    "wait_run": ("post", "/v1/runs/{run}/wait"),
    "message_run": ("post", "/v1/runs/{run}/messages"),
    "answer_run": ("post", "/v1/runs/{run}/answer"),
    "cancel_run": ("post", "/v1/runs/{run}/cancel"),
    "inbox": ("get", "/v1/tickets"),
    "get_ticket": ("get", "/v1/tickets/{ticket}"),
    "answer_ticket": ("post", "/v1/tickets/{ticket}/answer"),
    "approve": ("post", "/v1/tickets/{ticket}/approve"),
    "reject": ("post", "/v1/tickets/{ticket}/reject"),
    # The run as `get_run` reads it once its events say it settled.
    "wait_run_settled": ("get", "/v1/runs/{run}"),
}


@pytest.fixture(scope="module")
def document(server: Server) -> dict[str, Any]:
    answer = httpx.get(f"{server.base_url}/v1/openapi.json", timeout=30)
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    assert doc["openapi"].startswith("3.1")
    return doc


def _schema(document: dict[str, Any], place: tuple[str, ...]) -> dict[str, Any]:
    schema: dict[str, Any] = document["components"]["schemas"][place[0]]
    if len(place) > 1:
        member = schema["properties"][place[1]]
        objects = [s for s in member.get("oneOf", [member]) if s.get("type") == "object"]
        assert len(objects) == 1, f"{'.'.join(place)} is one object (or null): {member}"
        schema = objects[0]
    return schema


@pytest.mark.parametrize("kind", list(SCHEMAS), ids=lambda k: k.__name__)
def test_each_type_has_exactly_its_schemas_properties(document: dict[str, Any], kind: Any) -> None:
    schema = _schema(document, SCHEMAS[kind])
    where = ".".join(SCHEMAS[kind])
    assert schema.get("type") == "object", where
    properties = set(schema.get("properties", {}))
    required = set(schema.get("required", []))
    assert required <= properties, where
    assert set(kind.__annotations__) == properties, (
        f"{kind.__name__} vs {where}: only the type has {sorted(set(kind.__annotations__) - properties)}, "
        f"only the schema has {sorted(properties - set(kind.__annotations__))}"
    )
    assert set(kind.__required_keys__) == required, (
        f"{kind.__name__} vs {where}: required in the type {sorted(kind.__required_keys__)}, "
        f"in the schema {sorted(required)}"
    )
    assert set(kind.__optional_keys__) == properties - required, where


@pytest.mark.parametrize("kind", list(SCHEMAS), ids=lambda k: k.__name__)
def test_a_member_of_another_type_is_its_schema(document: dict[str, Any], kind: Any) -> None:
    """A list of a typed dict (`jobs`, `tickets`, `runs`) is an array of
    its schema's `$ref`; a typed dict member (`wait`, `answered_by`) is the
    schema `SCHEMAS` places there."""
    names = {k: place[0] for k, place in SCHEMAS.items() if len(place) == 1}
    schema = _schema(document, SCHEMAS[kind])
    for name, hint in typing.get_type_hints(kind).items():
        members = [hint, *typing.get_args(hint)]
        for member in members:
            if typing.get_origin(member) is list and typing.get_args(member)[0] in names:
                item = typing.get_args(member)[0]
                assert schema["properties"][name] == {"type": "array", "items": {"$ref": REF + names[item]}}, (kind, name)
            if member in SCHEMAS and len(SCHEMAS[member]) > 1:
                assert SCHEMAS[member] == (SCHEMAS[kind][0], name), (kind, name)


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value)


@pytest.mark.parametrize("method", list(ROUTES))
def test_each_method_answers_its_routes_schema(document: dict[str, Any], method: str) -> None:
    verb, path = ROUTES[method]
    answered = typing.get_type_hints(getattr(Client, method))["return"]
    assert typing.get_type_hints(getattr(AsyncClient, method))["return"] is answered, method
    assert answered in SCHEMAS and len(SCHEMAS[answered]) == 1, method
    ok = document["paths"][path][verb]["responses"]["200"]["content"]["application/json"]["schema"]
    refs = {r for r in _refs(ok) if r != REF + "ErrorEnvelope"}
    assert refs == {REF + SCHEMAS[answered][0]}, f"{method}: {verb.upper()} {path} answers {refs}"


def test_every_typed_method_is_checked_and_every_type_exported() -> None:
    typed = {
        name
        for name, member in vars(Client).items()
        if callable(member) and inspect.signature(member).return_annotation in {k.__name__ for k in SCHEMAS}
    }
    assert typed == set(ROUTES)
    assert {k.__name__ for k in SCHEMAS} <= set(toolfleet.__all__)


def _fits(value: Any, kind: Any) -> None:
    """`value` has every required key of `kind` and no key it lacks."""
    keys = set(value)
    assert set(kind.__required_keys__) <= keys, f"{kind.__name__} lacks {set(kind.__required_keys__) - keys}: {value}"
    assert keys <= set(kind.__annotations__), f"{kind.__name__} has no {keys - set(kind.__annotations__)}: {value}"


def test_what_the_server_answers_fits_the_types(client: Client) -> None:
    run = client.start_run(checkpoint={"step": 1}, idempotency_key=f"py-types-{uuid.uuid4()}")
    _fits(run, Run)
    later = client.call(OCR, {"receipt_ids": ["rcpt-005"]}, run_id=run["run_id"], delay_s=600)
    asked = client.call("ask_user", {"question": "Travel or meals?", "options": ["travel", "meals"]}, run_id=run["run_id"])
    assert later.job_id and asked.ticket

    parked = client.wait_run(run["run_id"], jobs=[later.job_id], tickets=[asked.ticket], checkpoint={"step": 2})
    _fits(parked, Run)
    read = client.get_run(run["run_id"])
    _fits(read, Run)
    assert "transcript" in read
    if read["wait"] is not None:
        _fits(read["wait"], RunWait)

    ticket = client.get_ticket(asked.ticket)
    _fits(ticket, Ticket)
    if isinstance(ticket["answered_by"], dict):
        _fits(ticket["answered_by"], TicketScope)
    inbox = client.inbox(state="open")
    _fits(inbox, TicketPage)
    assert inbox["tickets"], "the ticket just asked is in the inbox"
    for each in inbox["tickets"]:
        _fits(each, Ticket)
    _fits(client.answer_ticket(asked.ticket, "meals"), Ticket)

    jobs = client.list_jobs(tool=OCR, limit=5)
    _fits(jobs, JobPage)
    assert jobs["jobs"], "the job just started is listed"
    for job in jobs["jobs"]:
        _fits(job, JobSummary)

    runs = client.list_runs()
    _fits(runs, RunPage)
    for each_run in runs["runs"]:
        _fits(each_run, Run)
    cancelled = client.cancel_run(run["run_id"])
    _fits(cancelled, Run)
    _fits(client.wait_run_settled(run["run_id"], timeout_s=5), Run)
