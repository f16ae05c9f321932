// Type-checked by test/types.test.js (`tsc --noEmit`): the declarations of
// src/*.d.ts as a caller uses them, on the `ai` package's own types.

import { jsonSchema, tool, type Tool } from "ai";

import {
  Toolfleet,
  ToolfleetError,
  verifyWebhook,
  type Envelope,
  type ErrorCode,
  type RunRecord,
  type SseEvent,
  type TicketPage,
} from "@toolfleet/client";
import { aiSdkTools } from "@toolfleet/client/ai-sdk";
import type { Envelope as WireEnvelope, JobSummary } from "@toolfleet/client/openapi";

export async function usage(): Promise<void> {
  const client = new Toolfleet({ baseUrl: "http://127.0.0.1:8080", token: "t", fetch });
  const specs = await client.tools();
  const names: string[] = specs.map((s) => s.name);

  const page: Envelope<{ lines: unknown[] }> = await client.call("find_expenses", { month: "2026-09" }, { idempotencyKey: "k" });
  if (page.status === "ok") {
    const lines: unknown[] = page.result.lines;
    const callId: string = page.call_id;
    void lines;
    void callId;
  } else if (page.status === "error") {
    const code: ErrorCode = page.error.code;
    const message: string = page.error.message;
    void code;
    void message;
  } else if (page.status === "running") {
    const job = await client.waitJob(page.job_id, { timeoutS: 30 });
    const again = await client.getJob(page.job_id, { waitS: 5 });
    void job.settled;
    void again.raw;
  } else {
    const ticket: string = page.ticket;
    await client.inbox.answer(ticket, page.options[0]);
  }
  const wire: WireEnvelope = page.toJSON();
  void wire;

  const many = await client.callMany([["find_expenses", { month: "2026-09" }], { tool: "ask_user", args: {}, runAt: new Date() }]);
  void many[0].ok;

  const run: RunRecord = await client.runs.start({ agent: "expense_assistant", input: "hi" });
  for await (const event of client.runs.follow(run.run_id, { readTimeoutS: 30 })) {
    const e: SseEvent = event;
    if (e.json<{ state: string }>().state === "answered") break;
  }
  await client.runs.wait(run.run_id, { jobs: ["j"], for: "any" });
  const settled = await client.runs.waitSettled(run.run_id, { timeoutS: 10 });
  void settled.transcript;
  const inbox: TicketPage = await client.inbox.list({ state: "open", kind: "approval" });
  await client.inbox.reject(inbox.tickets[0].ticket, { reason: "no" });
  const jobs: JobSummary[] = (await client.listJobs({ tool: "x" })).jobs;
  void jobs;
  for await (const event of client.events({ states: ["succeeded"], signal: AbortSignal.timeout(1000) })) {
    void event.id;
  }

  try {
    await client.tools("cobol");
  } catch (error) {
    if (error instanceof ToolfleetError) {
      const status: number | null = error.status;
      const retry: boolean = error.retryable;
      void status;
      void retry;
    }
  }
  const valid: boolean = await verifyWebhook("secret", new Headers(), new Uint8Array(0), { toleranceS: null });
  void valid;

  // The adapter's tools are tools of the AI SDK.
  const tools = await aiSdkTools(client, { jsonSchema, names });
  const asTools: Record<string, Tool> = Object.fromEntries(
    Object.entries(tools).map(([name, t]) => [name, tool({ description: t.description, inputSchema: t.inputSchema, execute: t.execute })]),
  );
  const direct: Record<string, Tool> = tools;
  void asTools;
  void direct;
}
