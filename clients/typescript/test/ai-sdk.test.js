// The AI SDK adapter's tools in the real `ai` package's tool loop:
// `generateText` on a scripted model calls toolfleet through them.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Toolfleet } from "../src/index.js";
import { aiSdkTools } from "../src/ai-sdk.js";
import { startServer } from "./support/server.js";
import { importFrom, skipWithout } from "./support/toolchain.js";

const skip = skipWithout("ai");

let server;
let client;

before(async () => {
  if (skip) return;
  server = await startServer();
  client = new Toolfleet({ baseUrl: server.baseUrl, token: server.token });
});

after(async () => {
  await server?.stop();
});

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 5, text: 5, reasoning: 0 },
};

function toolCalls(calls) {
  return {
    content: calls.map(([id, name, input]) => ({ type: "tool-call", toolCallId: id, toolName: name, input: JSON.stringify(input) })),
    finishReason: { unified: "tool-calls", raw: undefined },
    usage,
    warnings: [],
  };
}

test("generateText calls toolfleet through the adapter's tools", { skip }, async () => {
  const { generateText, jsonSchema, stepCountIs, tool } = await importFrom("ai");
  const { MockLanguageModelV3 } = await importFrom("ai", "./test");
  const prompts = [];
  const replies = [
    toolCalls([
      ["call_1", "find_expenses", { month: "2026-09" }],
      ["call_2", "find_expenses", { month: "Sept" }],
    ]),
    toolCalls([["call_3", "start_receipt_ocr", { receipt_ids: ["rcpt-005"] }]]),
    { content: [{ type: "text", text: "Done." }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] },
  ];
  const model = new MockLanguageModelV3({
    doGenerate: async (options) => {
      prompts.push(options);
      return replies[prompts.length - 1];
    },
  });
  const tools = await aiSdkTools(client, { jsonSchema, names: ["find_expenses", "start_receipt_ocr"] });
  // They are what the package's own `tool()` makes of them.
  for (const t of Object.values(tools)) assert.equal(tool(t), t);

  const result = await generateText({ model, tools, prompt: "Read September's receipts.", stopWhen: stepCountIs(5) });
  assert.equal(result.text, "Done.");
  assert.equal(prompts.length, 3);
  // The model was told the tools' JSON Schemas.
  const offered = Object.fromEntries(prompts[0].tools.map((t) => [t.name, t]));
  assert.deepEqual(offered.find_expenses.inputSchema.required, ["month"]);
  assert.ok(offered.find_expenses.description.length > 0);

  const [first, second] = result.steps.map((s) => s.toolResults);
  assert.equal(first[0].output.status, "ok");
  assert.equal(first[0].output.result.lines.length, 50);
  // A tool's error is the model's to read, not a thrown one.
  assert.equal(first[1].output.status, "error");
  assert.equal(first[1].output.error.code, "invalid_arguments");
  // The job was waited for: the model read its result.
  assert.equal(second[0].output.status, "ok", JSON.stringify(second[0].output));
  assert.equal(second[0].output.result.receipts[0].receipt_id, "rcpt-005");
  const fed = prompts[2].prompt.at(-1);
  assert.equal(fed.role, "tool");
  assert.equal(fed.content[0].output.value.status, "ok");
});
