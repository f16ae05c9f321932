// The client against a real `toolfleet serve` (support/server.js).

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer } from "node:net";
import { after, before, test } from "node:test";

import {
  Envelope,
  SseEvent,
  Toolfleet,
  ToolfleetConnectionError,
  ToolfleetError,
  signWebhook,
  verifyWebhook,
} from "../src/index.js";
import { aiSdkTools } from "../src/ai-sdk.js";
import { refused } from "./support/refused.js";
import { WEBHOOK_SECRET, hookReceiver, startServer } from "./support/server.js";

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

test("tools in every format", async () => {
  const neutral = await client.tools();
  const names = new Set(neutral.map((s) => s.name));
  for (const name of ["find_expenses", "submit_report", OCR, "ask_user", "get_job", "cancel_job", "read_handle"]) {
    assert.ok(names.has(name), name);
  }
  const find = neutral.find((s) => s.name === "find_expenses");
  assert.equal(find.shape, "query");
  assert.deepEqual(find.input_schema.required, ["month"]);

  const sorted = (values) => [...values].sort();
  const openai = await client.tools("openai");
  assert.deepEqual(sorted(openai.map((t) => t.function.name)), sorted(names));
  assert.ok(openai.every((t) => t.type === "function"));
  const responses = await client.tools("openai-responses");
  assert.deepEqual(sorted(responses.map((t) => t.name)), sorted(names));
  const anthropic = await client.tools("anthropic");
  assert.deepEqual(sorted(anthropic.map((t) => t.name)), sorted(names));
  assert.ok(anthropic.every((t) => "input_schema" in t));
  const gemini = await client.tools("gemini");
  const declarations = Array.isArray(gemini) ? gemini[0].functionDeclarations : gemini.functionDeclarations;
  assert.deepEqual(sorted(declarations.map((d) => d.name)), sorted(names));
  const mcp = await client.tools("mcp");
  assert.deepEqual(sorted(mcp.map((t) => t.name)), sorted(names));
  assert.ok(mcp.every((t) => "inputSchema" in t));

  const error = await refused(client.tools("cobol"));
  assert.equal(error.status, 400);
  assert.equal(error.code, "bad_request");
});

test("a query answers ok", async () => {
  const page = await client.call("find_expenses", { month: "2026-09" });
  assert.ok(page instanceof Envelope);
  assert.ok(page.ok);
  assert.equal(page.status, "ok");
  assert.ok(page.call_id);
  assert.equal(page.result.lines.length, 50);
  const cursor = page.result.next_cursor;
  const second = await client.call("find_expenses", { month: "2026-09", cursor });
  assert.ok(second.ok);
  assert.equal(second.result.next_cursor ?? null, null);
  assert.equal(JSON.parse(JSON.stringify(page)).result.next_cursor, cursor);
  assert.deepEqual(Object.keys(JSON.parse(JSON.stringify(page))).sort(), Object.keys(page.raw).sort());
});

test("bad arguments are an error envelope, not an exception", async () => {
  const envelope = await client.call("find_expenses", { month: "Sept" });
  assert.ok(envelope.isError);
  assert.equal(envelope.error.code, "invalid_arguments");
  assert.match(envelope.error.message, /\/month/);
  assert.equal(envelope.error.retryable, false);
  assert.equal(envelope.error.details.violations[0].path, "/month");
  assert.throws(() => envelope.raiseForError(), (e) => e instanceof ToolfleetError && e.code === "invalid_arguments");

  const unknown = await client.call("find_expense", {});
  assert.equal(unknown.error.code, "unknown_tool");
  assert.ok(unknown.error.details.suggestions.includes("find_expenses"));
});

test("a job is waited for until it succeeds", async () => {
  const started = await client.call(OCR, { receipt_ids: ["rcpt-005", "rcpt-015"] });
  assert.ok(started.running);
  assert.ok(started.job_id && started.poll_after_s);
  const done = await client.waitJob(started.job_id, { timeoutS: 30 });
  assert.ok(done.ok, JSON.stringify(done));
  assert.deepEqual(done.result.receipts.map((r) => r.receipt_id).sort(), ["rcpt-005", "rcpt-015"]);
  // Read again, long-polled: the same outcome at once.
  const again = await client.getJob(started.job_id, { waitS: 5 });
  assert.ok(again.ok);
  assert.deepEqual(again.result, done.result);
  const listed = await client.listJobs({ tool: OCR, state: "succeeded", limit: 100 });
  assert.ok(listed.jobs.some((j) => j.job_id === started.job_id));
  // callAndWait does both.
  const both = await client.callAndWait(OCR, { receipt_ids: ["rcpt-025"] }, { timeoutS: 30 });
  assert.ok(both.ok);
  assert.equal(both.result.receipts[0].receipt_id, "rcpt-025");
});

test("a missing job throws, a cancelled job's error is a value", async () => {
  const missing = await refused(client.getJob(randomUUID()));
  assert.equal(missing.code, "not_found");
  assert.equal(missing.envelope.status, "error");

  const started = await client.call(OCR, { receipt_ids: ["rcpt-035"] }, { delayS: 600 });
  const scheduled = await client.getJob(started.job_id);
  assert.equal(scheduled.state, "scheduled");
  assert.ok(scheduled.run_at);
  const cancelled = await client.cancelJob(started.job_id);
  assert.ok(cancelled.isError);
  assert.equal(cancelled.state, "cancelled");
  assert.equal(cancelled.error.code, "cancelled");
  assert.equal((await client.waitJob(started.job_id, { timeoutS: 5 })).state, "cancelled");

  const at = new Date(Math.floor(Date.now() / 1000) * 1000 + 3600 * 1000);
  const later = await client.call(OCR, { receipt_ids: ["rcpt-035"] }, { runAt: at });
  const laterJob = await client.getJob(later.job_id);
  assert.equal(laterJob.state, "scheduled");
  assert.equal(Date.parse(laterJob.run_at), at.getTime());
  assert.equal((await client.cancelJob(later.job_id)).state, "cancelled");
});

test("many calls in one request", async () => {
  const results = await client.callMany([
    ["find_expenses", { month: "2026-09" }],
    { tool: OCR, args: { receipt_ids: ["rcpt-045"] } },
    { tool: "find_expenses", args: { month: "nope" } },
    { tool: OCR, args: { receipt_ids: ["rcpt-055"] }, priority: 5 },
  ]);
  assert.deepEqual(
    results.map((r) => r.status),
    ["ok", "running", "error", "error"],
  );
  assert.equal(results[2].error.code, "invalid_arguments");
  // The OCR pool is not ordered: a priority is that call's own bad_request.
  assert.equal(results[3].error.code, "bad_request");
  assert.ok((await client.waitJob(results[1].job_id, { timeoutS: 30 })).ok);
  const empty = await refused(client.callMany([]));
  assert.equal(empty.status, 400);
});

test("an idempotency key names one job", async () => {
  const key = `ts-${randomUUID()}`;
  const first = await client.call(OCR, { receipt_ids: ["rcpt-005"] }, { idempotencyKey: key });
  const second = await client.call(OCR, { receipt_ids: ["rcpt-005"] }, { idempotencyKey: key });
  assert.ok(first.running && second.running);
  assert.equal(first.job_id, second.job_id);
  const other = await client.call(OCR, { receipt_ids: ["rcpt-015"] }, { idempotencyKey: key });
  assert.equal(other.error.code, "conflict");
  const [batched] = await client.callMany([{ tool: OCR, args: { receipt_ids: ["rcpt-005"] }, idempotencyKey: key }]);
  assert.equal(batched.job_id, first.job_id);
});

test("a human tool opens a ticket answered from the inbox", async () => {
  const question = `Is exp-020 travel or meals? (${randomUUID()})`;
  const asked = await client.call("ask_user", { question, options: ["travel", "meals"] });
  assert.ok(asked.suspended);
  assert.match(asked.ticket, /^t_/);
  assert.equal(asked.question, question);
  assert.deepEqual(asked.options, ["travel", "meals"]);

  const inbox = await client.inbox.list({ state: "open", kind: "question" });
  const mine = inbox.tickets.filter((t) => t.ticket === asked.ticket);
  assert.equal(mine.length, 1);
  assert.equal(mine[0].question, question);
  assert.equal(mine[0].state, "open");

  const wrong = await refused(client.inbox.answer(asked.ticket, "lodging"));
  assert.equal(wrong.code, "invalid_arguments");

  const answered = await client.inbox.answer(asked.ticket, "travel");
  assert.equal(answered.state, "answered");
  assert.equal(answered.answer, "travel");
  assert.equal((await client.inbox.get(asked.ticket)).answer, "travel");
  const open = await client.inbox.list({ state: "open" });
  assert.ok(!open.tickets.some((t) => t.ticket === asked.ticket));

  const twice = await refused(client.inbox.answer(asked.ticket, "meals"));
  assert.equal(twice.code, "conflict");
  assert.ok(twice.envelope.error.details);
});

test("a command's dry run, then its commit with the confirm token", async () => {
  const args = { line_ids: ["exp-001", "exp-012"] };
  const plan = await client.call("submit_report", { ...args, dry_run: true });
  assert.ok(plan.ok, JSON.stringify(plan));
  assert.equal(plan.result.plan.lines, 2);
  const token = plan.result.confirm_token;
  assert.match(token, /^ct1\./);

  const unconfirmed = await client.call("submit_report", { ...args, dry_run: false });
  assert.equal(unconfirmed.error.code, "confirm_required");
  const forged = await client.call("submit_report", { ...args, dry_run: false, confirm_token: `${token.slice(0, -4)}0000` });
  assert.equal(forged.error.code, "invalid_confirm_token");

  const committed = await client.call("submit_report", { ...args, dry_run: false, confirm_token: token });
  assert.ok(committed.ok, JSON.stringify(committed));
  const repeated = await client.call("submit_report", { ...args, dry_run: false, confirm_token: token });
  assert.ok(repeated.ok);
  assert.deepEqual(repeated.result, committed.result);
});

test("events announce a job as it settles", async () => {
  const seen = [];
  const made = [];
  const controller = new AbortController();
  const events = client.events({ states: ["queued", "succeeded"], readTimeoutS: 30, signal: controller.signal });
  let settled = null;
  const listening = (async () => {
    for await (const event of events) {
      seen.push(event);
      if (made.includes(event.id) && event.json().state === "succeeded") {
        settled = event;
        return;
      }
    }
  })();
  const end = Date.now() + 20_000;
  while (!settled && Date.now() < end) {
    made.push((await client.call(OCR, { receipt_ids: ["rcpt-005"] })).job_id);
    await Promise.race([listening, new Promise((ok) => setTimeout(ok, 300))]);
  }
  controller.abort();
  await listening.catch(() => {});
  assert.ok(settled, `no succeeded event among ${seen.length} events`);
  assert.ok(settled instanceof SseEvent);
  assert.equal(settled.event, "job");
  const data = settled.json();
  assert.equal(data.kind, "job");
  assert.equal(data.tool, OCR);
  assert.equal(data.id, settled.id);
  assert.equal(data.body.status, "ok");
  assert.equal(data.body.result.receipts[0].receipt_id, "rcpt-005");
  assert.ok(seen.every((e) => ["queued", "succeeded"].includes(e.json().state)));
});

test("a silent stream times out and a bad filter throws", async () => {
  const iterator = client.events({ states: "cancelled", readTimeoutS: 0.5 })[Symbol.asyncIterator]();
  const silent = await refused(iterator.next());
  assert.ok(silent instanceof ToolfleetConnectionError);
  assert.equal(silent.code, "timeout");
  assert.ok(silent.retryable);
  const bad = await refused(client.events({ states: "finished" })[Symbol.asyncIterator]().next());
  assert.equal(bad.status, 400);
  assert.equal(bad.code, "bad_request");
  const missing = await refused(client.runs.follow("run_00000000000000000000000000000000")[Symbol.asyncIterator]().next());
  assert.equal(missing.code, "not_found");
});

test("a webhook verifies, a tampered one or another key does not", async () => {
  const hooks = await hookReceiver();
  try {
    const started = await client.call(OCR, { receipt_ids: ["rcpt-015"] }, { callbackUrl: `${hooks.url}/done` });
    assert.ok(started.running);
    const hook = await hooks.waitFor("/done");
    const body = JSON.parse(hook.body.toString("utf8"));
    assert.equal(body.event, "job.succeeded");
    assert.equal(body.job_id, started.job_id);
    assert.ok(hook.headers["toolfleet-delivery"]);
    const signature = hook.headers["toolfleet-signature"];

    // Node's lowercased headers, a Headers, title case in a plain object; bytes or text.
    assert.equal(await verifyWebhook(WEBHOOK_SECRET, hook.headers, hook.body), true);
    const titled = { "Content-Type": "application/json", "Toolfleet-Signature": signature };
    assert.equal(await verifyWebhook(new TextEncoder().encode(WEBHOOK_SECRET), titled, hook.body.toString("utf8")), true);
    assert.equal(await verifyWebhook(WEBHOOK_SECRET, new Headers(titled), new Uint8Array(hook.body)), true);

    const tampered = Buffer.from(hook.body.toString("utf8").replace("rcpt-015", "rcpt-016"));
    assert.equal(await verifyWebhook(WEBHOOK_SECRET, hook.headers, tampered), false);
    assert.equal(await verifyWebhook(WEBHOOK_SECRET, hook.headers, Buffer.concat([hook.body, Buffer.from(" ")])), false);
    assert.equal(await verifyWebhook("another-key-0123456789abcdef0123456789", hook.headers, hook.body), false);
    assert.equal(await verifyWebhook(WEBHOOK_SECRET, {}, hook.body), false);
    // An old signature is refused unless the tolerance is turned off.
    const t = Number(signature.split(",")[0].replace(/^t=/, ""));
    assert.equal(await verifyWebhook(WEBHOOK_SECRET, hook.headers, hook.body, { now: t + 3600 }), false);
    assert.equal(await verifyWebhook(WEBHOOK_SECRET, hook.headers, hook.body, { now: t + 3600, toleranceS: null }), true);
    // The header is the one signWebhook makes.
    assert.equal(await signWebhook(WEBHOOK_SECRET, t, hook.body), signature);
  } finally {
    hooks.close();
  }
});

test("the signature scheme matches the server's vector", async () => {
  // HMAC-SHA256("key", "1.{}"), as crates/server/src/webhooks.rs tests it.
  const header = "t=1,v1=1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224";
  const none = { toleranceS: null };
  assert.equal(await signWebhook("key", 1, "{}"), header);
  assert.equal(await verifyWebhook("key", { "Toolfleet-Signature": header }, "{}", none), true);
  assert.equal(await verifyWebhook("key", { "Toolfleet-Signature": header.toUpperCase().replace("T=", "t=").replace("V1=", "v1=") }, "{}", none), true);
  assert.equal(await verifyWebhook("key", { "Toolfleet-Signature": header }, "{} ", none), false);
  assert.equal(await verifyWebhook("key", { "Toolfleet-Signature": "t=1" }, "{}", none), false);
  assert.equal(await verifyWebhook("key", { "Toolfleet-Signature": "v1=00,t=x" }, "{}", none), false);
  assert.equal(await verifyWebhook("key", { "Toolfleet-Signature": header }, "{}"), false, "t=1 is long past");
});

test("a bad token throws ToolfleetError with its envelope", async () => {
  const stranger = new Toolfleet({ baseUrl: server.baseUrl, token: "tf_not_a_token" });
  const error = await refused(stranger.call("find_expenses", { month: "2026-09" }));
  assert.equal(error.status, 401);
  assert.equal(error.code, "unauthenticated");
  assert.equal(error.envelope.status, "error");
  assert.equal(error.message, error.envelope.error.message);
  assert.equal(error.retryable, false);
  const anonymous = new Toolfleet({ baseUrl: server.baseUrl });
  assert.equal((await refused(anonymous.tools())).status, 401);
});

test("a server that is not there throws unavailable", async () => {
  const port = await new Promise((ok) => {
    const probe = createServer();
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => ok(port));
    });
  });
  const nobody = new Toolfleet({ baseUrl: `http://127.0.0.1:${port}`, token: "t" });
  const error = await refused(nobody.tools());
  assert.ok(error instanceof ToolfleetConnectionError);
  assert.equal(error.code, "unavailable");
  assert.equal(error.status, null);
});

test("a fetch of one's own gets the root and the token", async () => {
  const seen = [];
  const mine = (url, init) => {
    seen.push({ url: String(url), init });
    return fetch(url, init);
  };
  const tf = new Toolfleet({ baseUrl: `${server.baseUrl}/`, token: server.token, fetch: mine });
  assert.ok((await tf.call("find_expenses", { month: "2026-09" })).ok);
  assert.equal(seen[0].url, `${server.baseUrl}/v1/calls`);
  assert.equal(seen[0].init.headers.authorization, `Bearer ${server.token}`);
});

test("the AI SDK adapter's tools execute toolfleet's calls", async () => {
  const schemas = [];
  const jsonSchema = (schema) => {
    schemas.push(schema);
    return { jsonSchema: schema };
  };
  const tools = await aiSdkTools(client, { jsonSchema, names: ["find_expenses", OCR] });
  assert.deepEqual(Object.keys(tools), ["find_expenses", OCR]);
  const find = tools.find_expenses;
  assert.ok(find.description.length > 0);
  assert.deepEqual(find.inputSchema.jsonSchema.required, ["month"]);
  assert.equal(schemas.length, 2);

  const page = await find.execute({ month: "2026-09" }, { toolCallId: "call_1", messages: [] });
  assert.equal(page.status, "ok");
  assert.equal(page.result.lines.length, 50);
  // A tool's error is for the model to read.
  const bad = await find.execute({ month: "Sept" }, { toolCallId: "call_2", messages: [] });
  assert.equal(bad.status, "error");
  assert.equal(bad.error.code, "invalid_arguments");
  const notAnObject = await find.execute("[1]", { toolCallId: "call_3", messages: [] });
  assert.equal(notAnObject.error.code, "invalid_arguments");
  // A job is waited for: the model reads its result.
  const job = await tools[OCR].execute({ receipt_ids: ["rcpt-005"] }, { toolCallId: "call_4", messages: [] });
  assert.equal(job.status, "ok", JSON.stringify(job));
  assert.equal(job.result.receipts[0].receipt_id, "rcpt-005");

  await assert.rejects(aiSdkTools(client, { jsonSchema, names: ["nope"] }), /no tool nope/);
});
