// A real `toolfleet serve` for the tests, and a scripted model for its
// expense assistant.
//
// The binary is the one `TOOLFLEET_BIN` names (the Rust test passes the one
// cargo built), else the repository's `target/release` or `target/debug`
// build, else `toolfleet` on the PATH. It runs in a temporary directory on
// the repository's expense pack, listening on a port the kernel picks, with
// no `[[auth.tokens]]`, so it makes a development token; webhooks may reach
// any port of 127.0.0.1 and are signed with `WEBHOOK_SECRET`. The
// assistant's model is a small OpenAI-compatible server here, named by
// `EXPENSES_MODEL_URL`.

import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const HERE = dirname(fileURLToPath(import.meta.url));
export const PACKAGE = resolve(HERE, "..", "..");
export const REPO = resolve(PACKAGE, "..", "..");
export const WEBHOOK_SECRET = "typescript-client-webhook-key-0123456789abcdef";
const PACK = join(REPO, "examples", "expenses", "toolfleet.toml");

/** The toolfleet binary the tests run. */
export function toolfleetBinary() {
  if (process.env.TOOLFLEET_BIN) return process.env.TOOLFLEET_BIN;
  for (const build of ["release", "debug"]) {
    const candidate = join(REPO, "target", build, "toolfleet");
    if (existsSync(candidate)) return candidate;
  }
  return "toolfleet";
}

function completion(message, finish) {
  return {
    id: "chatcmpl-scripted",
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model: "scripted",
    choices: [{ index: 0, message, finish_reason: finish }],
    usage: { prompt_tokens: 100, completion_tokens: 10, total_tokens: 110 },
  };
}

function calls(step, name, args) {
  return completion(
    {
      role: "assistant",
      content: null,
      tool_calls: [{ id: `call_${step}_0`, type: "function", function: { name, arguments: JSON.stringify(args) } }],
    },
    "tool_calls",
  );
}

/**
 * The scripted assistant: an input that asks to submit makes the
 * `submit_report` dry run, then the commit with the dry run's confirm token,
 * then answers with the commit's outcome; any other input lists the month's
 * lines, then answers with how many the first page had.
 */
export function chatReply(request) {
  const messages = request.messages;
  const user = messages.filter((m) => m.role === "user").at(-1).content;
  const step = messages.filter((m) => m.role === "assistant").length;
  if (messages.at(-1).role === "user") {
    if (user.includes("submit")) return calls(step, "submit_report", { line_ids: ["exp-001"], dry_run: true });
    return calls(step, "find_expenses", { month: "2026-09" });
  }
  const last = JSON.parse(messages.at(-1).content.replace(/^ERROR: /, ""));
  const error = last.error && typeof last.error === "object" ? last.error : null;
  if (user.includes("submit") && "plan" in last && "confirm_token" in last) {
    return calls(step, "submit_report", { line_ids: ["exp-001"], dry_run: false, confirm_token: last.confirm_token });
  }
  if (user.includes("submit")) {
    return completion({ role: "assistant", content: `The report came to: ${error ? error.code : "ok"}.` }, "stop");
  }
  const lines = (last.lines ?? []).length;
  return completion({ role: "assistant", content: `September has ${lines} lines on its first page.` }, "stop");
}

/** An HTTP server on 127.0.0.1 calling `handle(request, body)` for each POST. */
async function listen(handle) {
  const server = createServer((request, response) => {
    const chunks = [];
    request.on("data", (c) => chunks.push(c));
    request.on("end", () => handle(request, Buffer.concat(chunks), response));
  });
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  server.unref();
  return { server, url: `http://127.0.0.1:${server.address().port}` };
}

/** An OpenAI Chat Completions server answering `chatReply`. */
export async function scriptedChat() {
  const { server, url } = await listen((_request, body, response) => {
    const answer = JSON.stringify(chatReply(JSON.parse(body.toString("utf8"))));
    response.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(answer) });
    response.end(answer);
  });
  return { url: `${url}/v1`, close: () => server.close() };
}

/** Records every POST on 127.0.0.1, answering 204. */
export async function hookReceiver() {
  const hooks = [];
  const waiters = [];
  const { server, url } = await listen((request, body, response) => {
    hooks.push({ path: request.url, headers: request.headers, body });
    response.writeHead(204).end();
    for (const wake of waiters.splice(0)) wake();
  });
  return {
    url,
    hooks,
    /** The first hook to `path`, within `timeoutS`. */
    async waitFor(path, timeoutS = 20) {
      const end = Date.now() + timeoutS * 1000;
      for (;;) {
        const hook = hooks.find((h) => h.path === path);
        if (hook) return hook;
        if (Date.now() > end) throw new Error(`no webhook to ${path} within ${timeoutS} s`);
        await new Promise((wake) => {
          waiters.push(wake);
          setTimeout(wake, 200);
        });
      }
    },
    close: () => server.close(),
  };
}

/**
 * Starts `toolfleet serve` in a temporary directory: `{baseUrl, token,
 * dataDir, stop()}`.
 */
export async function startServer() {
  const model = await scriptedChat();
  const directory = mkdtempSync(join(tmpdir(), "toolfleet-ts-"));
  const config = join(directory, "toolfleet.toml");
  writeFileSync(
    config,
    `listen = "127.0.0.1:0"
data_dir = ${JSON.stringify(join(directory, "data"))}
include = [${JSON.stringify(PACK)}]

[webhooks]
allow = ["127.0.0.1:*"]
secret = "${WEBHOOK_SECRET}"
`,
  );
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TOOLFLEET_")));
  env.EXPENSES_MODEL_URL = model.url;
  env.TOOLFLEET_LOG = "warn";
  const child = spawn(toolfleetBinary(), ["--config", config, "serve"], {
    cwd: directory,
    env,
    stdio: ["ignore", "ignore", "pipe"],
  });
  const said = [];
  const base = await new Promise((ok, fail) => {
    const lines = createInterface({ input: child.stderr });
    let found = false;
    lines.on("line", (line) => {
      if (found) return; // Keep draining stderr so the server never blocks on a full pipe.
      said.push(line);
      const match = /toolfleet serving on (\S+)/.exec(line);
      if (match) {
        found = true;
        ok(match[1]);
      }
    });
    child.on("error", fail);
    child.on("exit", (code) => {
      if (!found) fail(new Error(`toolfleet serve exited (${code}) before serving:\n${said.join("\n")}`));
    });
  });
  const token = readFileSync(join(directory, "data", "dev-token"), "utf8").trim();
  if (!said.some((line) => line.includes(token))) throw new Error("serve prints the token it made");
  return {
    baseUrl: base,
    token,
    dataDir: join(directory, "data"),
    async stop() {
      child.kill("SIGKILL");
      await new Promise((ok) => (child.exitCode !== null || child.signalCode !== null ? ok() : child.on("exit", ok)));
      model.close();
      rmSync(directory, { recursive: true, force: true });
    },
  };
}
