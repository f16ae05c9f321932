// Runs, of the expense assistant (its model scripted in support/server.js)
// and driven by the caller, and approvals from the inbox.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Toolfleet } from "../src/index.js";
import { refused } from "./support/refused.js";
import { startServer } from "./support/server.js";

const OCR = "start_receipt_ocr";

let server;
let client;

before(async () => {
  server = await startServer();
  client = new Toolfleet({ baseUrl: server.baseUrl, token: server.token });
});

after(async () => {
  await server?.stop();
});

async function until(what, check, timeoutS = 20) {
  const end = Date.now() + timeoutS * 1000;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > end) throw new Error(`${what} within ${timeoutS} s`);
    await new Promise((ok) => setTimeout(ok, 100));
  }
}

test("an assistant's run answers, followed over SSE, and takes another message", async () => {
  const run = await client.runs.start({ agent: "expense_assistant", input: "How many lines has September?" });
  assert.match(run.run_id, /^run_/);
  assert.equal(run.agent, "expense_assistant");

  const states = [];
  for await (const event of client.runs.follow(run.run_id, { readTimeoutS: 30 })) {
    assert.match(event.event, /^run\./);
    states.push(event.json().state);
    if (event.json().state === "answered") break;
  }
  assert.equal(states.at(-1), "answered");

  const done = await client.runs.get(run.run_id);
  assert.equal(done.answer, "September has 50 lines on its first page.");
  const calls = done.transcript.filter((e) => e.type === "tool_call");
  assert.deepEqual(
    calls.map((c) => c.tool),
    ["find_expenses"],
  );
  assert.equal(calls[0].envelope.status, "ok");
  const listed = await client.runs.list({ agent: "expense_assistant" });
  assert.ok(listed.runs.some((r) => r.run_id === run.run_id));

  await client.runs.message(run.run_id, "And again, please?");
  const again = await client.runs.waitSettled(run.run_id, { timeoutS: 30 });
  assert.equal(again.state, "answered");
  assert.deepEqual(
    again.transcript.filter((e) => e.type === "user").map((e) => e.content),
    ["How many lines has September?", "And again, please?"],
  );
  assert.equal(again.transcript.filter((e) => e.type === "tool_call").length, 2);
});

async function approvalOf(runId) {
  return until("an approval ticket", async () => {
    const { tickets } = await client.inbox.list({ state: "open", kind: "approval" });
    return tickets.find((t) => t.run_id === runId);
  });
}

test("an approved commit runs once and the run answers", async () => {
  const run = await client.runs.start({ agent: "expense_assistant", input: "Please submit exp-001." });
  const ticket = await approvalOf(run.run_id);
  assert.equal(ticket.kind, "approval");
  assert.equal(ticket.tool, "submit_report");
  assert.equal(ticket.plan.lines, 1);
  assert.equal((await client.runs.get(run.run_id)).state, "waiting");

  const approved = await client.inbox.approve(ticket.ticket);
  assert.equal(approved.state, "answered");
  assert.equal(approved.outcome.status, "ok");
  const done = await client.runs.waitSettled(run.run_id, { timeoutS: 30 });
  assert.equal(done.state, "answered");
  assert.equal(done.answer, "The report came to: ok.");

  const twice = await refused(client.inbox.approve(ticket.ticket));
  assert.ok(["conflict", "invalid_arguments"].includes(twice.code), twice.code);
});

test("a rejected commit reaches the run as rejected", async () => {
  const run = await client.runs.start({ agent: "expense_assistant", input: "Please submit exp-001 now." });
  const ticket = await approvalOf(run.run_id);
  const rejected = await client.inbox.reject(ticket.ticket, { reason: "not this month" });
  assert.equal(rejected.outcome.error.code, "rejected");
  assert.equal(rejected.outcome.error.details.reason, "not this month");
  const done = await client.runs.waitSettled(run.run_id, { timeoutS: 30 });
  assert.equal(done.answer, "The report came to: rejected.");
});

test("a run the caller drives parks on its job and ticket, resumes and answers", async () => {
  const run = await client.runs.start({ checkpoint: { step: 1 }, idempotencyKey: `ts-run-${Date.now()}-${Math.random()}` });
  const runId = run.run_id;
  assert.equal(run.state, "running");
  assert.equal(run.agent ?? null, null);

  const started = await client.call(OCR, { receipt_ids: ["rcpt-005"] }, { runId });
  const asked = await client.call("ask_user", { question: "Travel or meals?", options: ["travel", "meals"] }, { runId });
  assert.ok(started.running && asked.suspended);
  const parked = await client.runs.wait(runId, { jobs: [started.job_id], tickets: [asked.ticket], checkpoint: { step: 2 } });
  assert.ok(["waiting", "running"].includes(parked.state));

  await client.inbox.answer(asked.ticket, "meals");
  const resumed = await until("the run resumed", async () => {
    const r = await client.runs.get(runId);
    return r.resumed ? r : null;
  });
  assert.equal(resumed.state, "running");
  assert.deepEqual(resumed.resumed.checkpoint, { step: 2 });
  const items = Object.fromEntries(resumed.resumed.items.map((item) => [item.kind, item]));
  assert.equal(items.job.id, started.job_id);
  assert.equal(items.job.envelope.status, "ok");
  assert.equal(items.ticket.envelope.result.answer, "meals");

  const answered = await client.runs.answer(runId, "Done: one receipt read.", { checkpoint: { step: 3 } });
  assert.equal(answered.state, "answered");
  assert.equal(answered.answer, "Done: one receipt read.");

  // The same key answers the same run; cancelling stops it.
  const key = `ts-same-${runId}`;
  const other = await client.runs.start({ checkpoint: { step: 1 }, idempotencyKey: key });
  const same = await client.runs.start({ checkpoint: { step: 1 }, idempotencyKey: key });
  assert.equal(other.run_id, same.run_id);
  assert.equal((await client.runs.cancel(other.run_id)).state, "cancelled");
});

test("waiting for a run that does not settle ends at its timeout", async () => {
  const run = await client.runs.start({ checkpoint: {} });
  const later = await client.call(OCR, { receipt_ids: ["rcpt-005"] }, { runId: run.run_id, delayS: 600 });
  assert.equal((await client.runs.wait(run.run_id, { jobs: [later.job_id] })).state, "waiting");
  const started = Date.now();
  const still = await client.runs.waitSettled(run.run_id, { timeoutS: 1.5 });
  assert.equal(still.state, "waiting");
  assert.ok(Date.now() - started < 10_000);
  assert.equal((await client.runs.cancel(run.run_id)).state, "cancelled");
  assert.equal((await client.getJob(later.job_id)).state, "cancelled");
});

test("an unknown assistant throws", async () => {
  const error = await refused(client.runs.start({ agent: "nobody", input: "hi" }));
  assert.equal(error.code, "invalid_arguments");
  assert.match(error.message, /expense_assistant/);
});
