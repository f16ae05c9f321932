// `Toolfleet`: one surface over the HTTP API of docs/API.md, on `fetch` alone.
//
// What throws and what answers:
//
// - A tool call (`call`, `callMany`, `callAndWait`) answers its envelope,
//   `error` included: a tool's error is for the model to read. Only the
//   request's own failure throws `ToolfleetError` (401 `unauthenticated`,
//   400 `bad_request`, 413, 503 `unavailable`...).
// - `getJob` and `waitJob` answer the job's envelope, its final `error`
//   (with `state` `failed` or `cancelled`) included; an `error` about the
//   request (`not_found`, `forbidden`) throws.
// - Everything else (runs, tickets, the inbox, the job list, tools) answers
//   the `result` of an `ok` envelope (or the route's JSON) and throws
//   `ToolfleetError` for an `error` envelope, whatever its HTTP status.

import { Envelope } from "./envelope.js";
import { ToolfleetConnectionError, ToolfleetError } from "./errors.js";
import { SseParser, lines } from "./sse.js";

/** Where `toolfleet serve` listens by default. */
export const DEFAULT_URL = "http://127.0.0.1:8080";
/** The longest `waitS` of one long poll of `getJob`. */
export const MAX_WAIT_S = 30;
/** The run states after which a run's events stream ends. */
export const RUN_SETTLED = Object.freeze(["answered", "failed", "budget_exceeded", "cancelled"]);

const VERSION = "0.1.0";

/** The wire name of each option of a call. */
const CALL_FIELDS = {
  idempotencyKey: "idempotency_key",
  runId: "run_id",
  callbackUrl: "callback_url",
  runAt: "run_at",
  delayS: "delay_s",
  priority: "priority",
};

/**
 * The body of `POST /v1/calls` for one call.
 * @param {string} tool
 * @param {Record<string, unknown> | undefined | null} args
 * @param {Record<string, any>} [options]
 */
function callBody(tool, args, options = {}) {
  /** @type {Record<string, any>} */
  const body = { tool, args: args ?? {} };
  for (const [option, wire] of Object.entries(CALL_FIELDS)) {
    let value = options[option] ?? options[wire];
    if (value === undefined || value === null) continue;
    if (value instanceof Date) value = value.toISOString();
    body[wire] = value;
  }
  return body;
}

/** One call of a batch: `[tool, args]`, or `{tool, args, ...options}`. */
function batchItem(call) {
  if (Array.isArray(call)) return callBody(call[0], call[1]);
  const { tool, args, ...options } = call;
  return callBody(tool, args, options);
}

function waitS(value) {
  if (value === undefined || value === null) return undefined;
  return Math.max(0, Math.min(MAX_WAIT_S, Math.trunc(value)));
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function retryAfter(response) {
  const value = response.headers.get("retry-after");
  if (value === null) return null;
  const seconds = Number(value);
  return Number.isFinite(seconds) ? seconds : null;
}

/** The JSON of an answer, or `undefined` when it is not JSON. */
function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** The JSON of a 2xx answer; throws for any other status. */
function check(response, text) {
  const body = parse(text);
  if (response.ok) return body;
  if (isObject(body) && isObject(body.error)) {
    const error = ToolfleetError.fromEnvelope(body, response.status);
    if (error.retryAfterS === null) error.retryAfterS = retryAfter(response);
    throw error;
  }
  throw new ToolfleetError("http_error", `HTTP ${response.status}: ${text.slice(0, 500)}`, {
    status: response.status,
    retryAfterS: retryAfter(response),
  });
}

function envelope(response, text) {
  const body = check(response, text);
  if (!isObject(body) || !("status" in body)) {
    throw new ToolfleetError("bad_answer", `not an envelope: ${text.slice(0, 500)}`, { status: response.status });
  }
  return new Envelope(body);
}

/** The `result` of an `ok` envelope; throws for an `error` one. */
function result(response, text) {
  const body = check(response, text);
  if (isObject(body) && body.status === "error") throw ToolfleetError.fromEnvelope(body, response.status);
  if (isObject(body) && "status" in body && "result" in body) return body.result;
  return body;
}

/** A job's envelope: its own final error is a value, an error about the request throws. */
function job(response, text) {
  const answer = envelope(response, text);
  if (answer.isError && (answer.state === undefined || answer.state === null)) {
    throw ToolfleetError.fromEnvelope(answer.raw, response.status);
  }
  return answer;
}

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params ?? {})) {
    if (value === undefined || value === null) continue;
    search.set(key, Array.isArray(value) ? value.join(",") : String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/** A signal that aborts after `ms`, or when `signal` does. */
function deadline(ms, signal) {
  const signals = [];
  if (ms !== undefined && ms !== null) signals.push(AbortSignal.timeout(ms));
  if (signal) signals.push(signal);
  if (signals.length === 0) return undefined;
  return signals.length === 1 ? signals[0] : AbortSignal.any(signals);
}

function transportError(what, error, signal) {
  if (signal?.aborted && signal.reason?.name !== "TimeoutError") throw signal.reason;
  const timedOut = error?.name === "TimeoutError" || signal?.reason?.name === "TimeoutError";
  const cause = error?.cause ?? error;
  return new ToolfleetConnectionError(
    timedOut ? "timeout" : "unavailable",
    `${what}: ${timedOut ? "no answer in time" : (cause?.message ?? String(cause))}`,
    error,
  );
}

/**
 * A client of one toolfleet server, as one principal (its bearer token).
 */
export class Toolfleet {
  /**
   * @param {{baseUrl?: string, token?: string | null, fetch?: typeof fetch, headers?: Record<string, string>, timeoutS?: number}} [options]
   */
  constructor(options = {}) {
    this.baseUrl = (options.baseUrl ?? DEFAULT_URL).replace(/\/+$/, "");
    this.token = options.token ?? null;
    this.timeoutS = options.timeoutS ?? 30;
    const fetcher = options.fetch ?? globalThis.fetch;
    if (typeof fetcher !== "function") throw new TypeError("no fetch: pass one as `fetch`");
    this._fetch = fetcher;
    /** @type {Record<string, string>} */
    this.headers = { accept: "application/json", "user-agent": `toolfleet-typescript/${VERSION}` };
    if (this.token) this.headers.authorization = `Bearer ${this.token}`;
    for (const [key, value] of Object.entries(options.headers ?? {})) this.headers[key.toLowerCase()] = value;
    this.runs = new Runs(this);
    this.inbox = new Inbox(this);
  }

  /**
   * One request: its answer and text.
   * @param {string} method
   * @param {string} path
   * @param {{body?: unknown, timeoutS?: number, signal?: AbortSignal}} [options]
   */
  async _send(method, path, options = {}) {
    const headers = { ...this.headers };
    const init = { method, headers };
    if (options.body !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    const signal = deadline((options.timeoutS ?? this.timeoutS) * 1000, options.signal);
    if (signal) init.signal = signal;
    try {
      const response = await this._fetch(`${this.baseUrl}${path}`, init);
      return [response, await response.text()];
    } catch (error) {
      throw transportError(`${method} ${path}`, error, signal);
    }
  }

  async _result(method, path, options) {
    const [response, text] = await this._send(method, path, options);
    return result(response, text);
  }

  // Tools and calls.

  /**
   * `GET /v1/tools?format=F`: the specs the caller may call, in the form of
   * `neutral`, `openai`, `openai-responses`, `anthropic`, `gemini` or `mcp`.
   */
  async tools(format = "neutral") {
    const [response, text] = await this._send("GET", `/v1/tools${query({ format })}`);
    return check(response, text);
  }

  /**
   * Calls `tool`: its envelope, a tool's `error` included.
   * @param {string} tool
   * @param {Record<string, unknown>} [args]
   * @param {Record<string, any>} [options]
   */
  async call(tool, args = {}, options = {}) {
    const [response, text] = await this._send("POST", "/v1/calls", {
      body: callBody(tool, args, options),
      signal: options.signal,
    });
    return envelope(response, text);
  }

  /**
   * Makes every call in one request (1 to 1,000): an envelope each, in
   * order. A call is `[tool, args]` or `{tool, args, ...options}`.
   */
  async callMany(calls, options = {}) {
    const [response, text] = await this._send("POST", "/v1/calls", {
      body: { calls: Array.from(calls, batchItem) },
      signal: options.signal,
    });
    const body = check(response, text);
    if (!isObject(body) || !Array.isArray(body.results)) {
      throw new ToolfleetError("bad_answer", `not a batch's results: ${text.slice(0, 500)}`, { status: response.status });
    }
    return body.results.map((e) => new Envelope(e));
  }

  /**
   * Calls `tool` and, when it started a job, waits up to `timeoutS` (default
   * 60) for it to settle (`waitJob`).
   */
  async callAndWait(tool, args = {}, options = {}) {
    const { timeoutS = 60, ...rest } = options;
    const started = await this.call(tool, args, rest);
    if (started.running && started.job_id) return this.waitJob(started.job_id, { timeoutS, signal: rest.signal });
    return started;
  }

  // Jobs.

  /**
   * `get_job`: the job's envelope; with `waitS` (0 to 30) waits up to that
   * long for it to settle.
   * @param {string} jobId
   * @param {{waitS?: number, signal?: AbortSignal}} [options]
   */
  async getJob(jobId, options = {}) {
    const wait = waitS(options.waitS);
    const [response, text] = await this._send("GET", `/v1/jobs/${encodeURIComponent(jobId)}${query({ wait_s: wait })}`, {
      timeoutS: (wait ?? 0) + 30,
      signal: options.signal,
    });
    return job(response, text);
  }

  /**
   * Long-polls `getJob` until the job settles or `timeoutS` (default 60)
   * passes: its envelope, still `running` when the time ran out.
   * @param {string} jobId
   * @param {{timeoutS?: number, signal?: AbortSignal}} [options]
   */
  async waitJob(jobId, options = {}) {
    const { timeoutS = 60, signal } = options;
    const end = Date.now() + timeoutS * 1000;
    for (;;) {
      const left = (end - Date.now()) / 1000;
      const answer = await this.getJob(jobId, { waitS: Math.max(0, Math.min(MAX_WAIT_S, left)), signal });
      if (answer.settled || end - Date.now() <= 0) return answer;
      if (left < 1) await sleep(Math.max(0, Math.min(200, end - Date.now())));
    }
  }

  /** Cancels a job that has not settled: its envelope as it now stands. */
  async cancelJob(jobId) {
    const [response, text] = await this._send("POST", `/v1/jobs/${encodeURIComponent(jobId)}/cancel`);
    return job(response, text);
  }

  /** `GET /v1/jobs`: `{jobs, next_cursor}`, newest first. */
  async listJobs(options = {}) {
    const { state, tool, limit, cursor } = options;
    return this._result("GET", `/v1/jobs${query({ state, tool, limit, cursor })}`);
  }

  // Events.

  /**
   * `GET /v1/events`: the caller's jobs' and tickets' events as they come
   * (`event` `job` or `ticket`, `id`, and `json()` the event with its
   * `state` and `body`), as an async iterator. Leaving the `for await`
   * loop (or `signal`) closes the stream; `readTimeoutS` bounds the wait
   * for the next bytes (keep-alives count).
   * @param {{states?: string | string[], signal?: AbortSignal, readTimeoutS?: number}} [options]
   */
  events(options = {}) {
    return this._stream(`/v1/events${query({ state: options.states })}`, options);
  }

  /**
   * @param {string} path
   * @param {{signal?: AbortSignal, readTimeoutS?: number, until?: number}} options
   */
  async *_stream(path, options) {
    const controller = new AbortController();
    const signal = options.signal ? AbortSignal.any([options.signal, controller.signal]) : controller.signal;
    const readTimeoutMs = options.readTimeoutS === undefined || options.readTimeoutS === null ? null : options.readTimeoutS * 1000;
    let timer;
    /** Waits for `promise`, or throws `timeout` after the read timeout (or at `until`). */
    const timed = (promise) => {
      let ms = readTimeoutMs;
      if (options.until !== undefined) ms = Math.min(ms ?? Infinity, Math.max(0, options.until - Date.now()));
      if (ms === null || ms === Infinity) return promise;
      return Promise.race([
        promise,
        new Promise((_, reject) => {
          timer = setTimeout(() => {
            const error = new DOMException("no data in time", "TimeoutError");
            controller.abort(error);
            reject(new ToolfleetConnectionError("timeout", `GET ${path}: no data within ${ms / 1000} s`, error));
          }, ms);
        }),
      ]).finally(() => clearTimeout(timer));
    };
    let response;
    try {
      response = await timed(
        this._fetch(`${this.baseUrl}${path}`, {
          method: "GET",
          headers: { ...this.headers, accept: "text/event-stream" },
          signal,
        }),
      );
    } catch (error) {
      if (error instanceof ToolfleetError) throw error;
      throw transportError(`GET ${path}`, error, options.signal);
    }
    try {
      const type = response.headers.get("content-type") ?? "";
      if (!response.ok || !type.startsWith("text/event-stream") || !response.body) {
        const text = await response.text();
        result(response, text);
        throw new ToolfleetError("bad_answer", `not an event stream: ${text.slice(0, 500)}`, {
          status: response.status,
        });
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      const chunks = async function* () {
        for (;;) {
          const { done, value } = await timed(reader.read());
          if (done) return;
          yield value;
        }
      };
      const parser = new SseParser();
      try {
        for await (const line of lines(chunks())) {
          const event = parser.feed(line);
          if (event) yield event;
        }
      } catch (error) {
        if (error instanceof ToolfleetError) throw error;
        throw transportError(`GET ${path}`, error, options.signal);
      } finally {
        reader.cancel().catch(() => {});
      }
    } finally {
      clearTimeout(timer);
      controller.abort();
    }
  }
}

/** Runs: an assistant's, or one the caller drives (docs/API.md, Runs). */
class Runs {
  /** @param {Toolfleet} client */
  constructor(client) {
    this.client = client;
  }

  /**
   * `POST /v1/runs`: a run of the assistant `agent` on `input`, or (with
   * `checkpoint` and no agent) a run the caller drives. Answers the run.
   */
  async start(options = {}) {
    const { agent, input, checkpoint, callbackUrl, idempotencyKey } = options;
    const body = {};
    if (agent !== undefined) body.agent = agent;
    if (input !== undefined) body.input = input;
    if (checkpoint !== undefined) body.checkpoint = checkpoint;
    if (callbackUrl !== undefined) body.callback_url = callbackUrl;
    if (idempotencyKey !== undefined) body.idempotency_key = idempotencyKey;
    return this.client._result("POST", "/v1/runs", { body });
  }

  /** The run, its transcript included. */
  async get(runId) {
    return this.client._result("GET", `/v1/runs/${encodeURIComponent(runId)}`);
  }

  /** `{runs, next_cursor}`, newest first, without transcripts. */
  async list(options = {}) {
    const { state, agent, cursor } = options;
    return this.client._result("GET", `/v1/runs${query({ state, agent, cursor })}`);
  }

  /**
   * The run's events (`run.<state>`, data the run without transcript and the
   * `entries` it gained): first the run as it stands, then each change,
   * until it answered or stopped.
   * @param {string} runId
   * @param {{signal?: AbortSignal, readTimeoutS?: number}} [options]
   */
  follow(runId, options = {}) {
    return this.client._stream(`/v1/runs/${encodeURIComponent(runId)}/events`, options);
  }

  /**
   * Follows the run's events until it is answered, failed, out of budget or
   * cancelled (or `timeoutS`, default 60, passes): the run as it then reads,
   * transcript included.
   */
  async waitSettled(runId, options = {}) {
    const { timeoutS = 60, signal } = options;
    const until = Date.now() + timeoutS * 1000;
    try {
      for await (const event of this.client._stream(`/v1/runs/${encodeURIComponent(runId)}/events`, { signal, until })) {
        if (RUN_SETTLED.includes(event.json().state)) break;
      }
    } catch (error) {
      if (!(error instanceof ToolfleetConnectionError && error.code === "timeout")) throw error;
    }
    return this.get(runId);
  }

  /**
   * `POST /v1/runs/{run}/wait`: parks a run the caller drives on its jobs and
   * tickets (`for` `all` or `any`) with its checkpoint.
   */
  async wait(runId, options = {}) {
    const { jobs = [], tickets = [], checkpoint } = options;
    const body = { for: options.for ?? "all", jobs: [...jobs], tickets: [...tickets] };
    if (checkpoint !== undefined) body.checkpoint = checkpoint;
    return this.client._result("POST", `/v1/runs/${encodeURIComponent(runId)}/wait`, { body });
  }

  /** The user's next message to an answered run of an assistant. */
  async message(runId, content) {
    return this.client._result("POST", `/v1/runs/${encodeURIComponent(runId)}/messages`, { body: { content } });
  }

  /** Records the answer of a run the caller drives. */
  async answer(runId, answer, options = {}) {
    const body = { answer };
    if (options.checkpoint !== undefined) body.checkpoint = options.checkpoint;
    return this.client._result("POST", `/v1/runs/${encodeURIComponent(runId)}/answer`, { body });
  }

  /** Stops a run (and cancels the jobs it waits on). */
  async cancel(runId) {
    return this.client._result("POST", `/v1/runs/${encodeURIComponent(runId)}/cancel`);
  }
}

/** The inbox: the tickets of questions and approvals. */
class Inbox {
  /** @param {Toolfleet} client */
  constructor(client) {
    this.client = client;
  }

  /** `GET /v1/tickets`: `{tickets, next_cursor}`, the tickets the caller may answer, newest first. */
  async list(options = {}) {
    const { state, kind, cursor } = options;
    return this.client._result("GET", `/v1/tickets${query({ state, kind, cursor })}`);
  }

  async get(ticket) {
    return this.client._result("GET", `/v1/tickets/${encodeURIComponent(ticket)}`);
  }

  /**
   * Answers a question (one of its options, when it has some): the answered
   * ticket. A second answer throws `conflict`.
   */
  async answer(ticket, answer) {
    return this.client._result("POST", `/v1/tickets/${encodeURIComponent(ticket)}/answer`, { body: { answer } });
  }

  /** Approves the commit an approval ticket holds: it runs once, now. */
  async approve(ticket) {
    return this.client._result("POST", `/v1/tickets/${encodeURIComponent(ticket)}/approve`, { body: {} });
  }

  /** Rejects the commit an approval ticket holds. */
  async reject(ticket, options = {}) {
    const body = {};
    if (options.reason !== undefined) body.reason = options.reason;
    return this.client._result("POST", `/v1/tickets/${encodeURIComponent(ticket)}/reject`, { body });
  }
}
