// The types of @toolfleet/client (src/*.js). The wire shapes come from
// ./openapi.d.ts, generated from toolfleet's OpenAPI document.

import type * as api from "./openapi.js";

export type * as api from "./openapi.js";
export type {
  ErrorCode,
  ErrorEnvelope,
  JobPage,
  JobSummary,
  OkEnvelope,
  Run,
  RunPage,
  RunningEnvelope,
  SuspendedEnvelope,
  Ticket,
  TicketPage,
  ToolError,
} from "./openapi.js";

/** Where `toolfleet serve` listens by default. */
export declare const DEFAULT_URL: "http://127.0.0.1:8080";
/** The longest `waitS` of one long poll of `getJob`. */
export declare const MAX_WAIT_S: 30;
/** The run states after which a run's events stream ends. */
export declare const RUN_SETTLED: readonly ["answered", "failed", "budget_exceeded", "cancelled"];

/** The formats of `GET /v1/tools` (any other string is sent as it is). */
export type ToolFormat = "neutral" | "openai" | "openai-responses" | "anthropic" | "gemini" | "mcp" | (string & {});

/** A tool as `GET /v1/tools?format=neutral` describes it. */
export interface ToolSpec {
  name: string;
  title?: string;
  description: string;
  shape: "query" | "command" | "job" | "human" | (string & {});
  input_schema: Record<string, unknown>;
  [key: string]: unknown;
}

/** What an envelope has beside its wire fields. */
export interface EnvelopeMethods {
  /** The JSON object as it came, with any field the types do not name. */
  readonly raw: api.Envelope & Record<string, unknown>;
  readonly ok: boolean;
  readonly isError: boolean;
  readonly running: boolean;
  readonly suspended: boolean;
  /** Whether nothing more will come of it by waiting: not `running`. */
  readonly settled: boolean;
  /** The envelope as it came (what `JSON.stringify` writes). */
  toJSON(): api.Envelope & Record<string, unknown>;
  /** Throws a `ToolfleetError` for an `error` envelope; else answers itself. */
  raiseForError(): this;
}

/**
 * One tool call's (or `getJob`'s) answer, its wire fields as they came:
 * narrow it on `status`. A tool's error is a value, not an exception.
 */
export type Envelope<Result = any> = (
  | (Omit<api.OkEnvelope, "result"> & { result: Result })
  | api.ErrorEnvelope
  | api.RunningEnvelope
  | api.SuspendedEnvelope
) &
  EnvelopeMethods;

export declare const Envelope: {
  new <Result = any>(raw: api.Envelope | Record<string, unknown>): Envelope<Result>;
  readonly prototype: EnvelopeMethods;
};

/**
 * A request the API refused or could not answer: a transport status (401,
 * 400, 429, 503...) or, on routes other than tool calls, an `error`
 * envelope.
 */
export declare class ToolfleetError extends Error {
  constructor(
    code: string,
    message: string,
    options?: { status?: number | null; envelope?: unknown; retryAfterS?: number | null; cause?: unknown },
  );
  /** The envelope's error code (`api.ErrorCode`), else `http_error`, `bad_answer`, `timeout` or `unavailable`. */
  code: api.ErrorCode | "http_error" | "bad_answer" | (string & {});
  /** The error's message (the envelope's, when there was one). */
  message: string;
  /** The HTTP status of the answer, `null` when none came. */
  status: number | null;
  /** The whole JSON body, when it was an error envelope. */
  envelope: (api.ErrorEnvelope & Record<string, unknown>) | null;
  /** How long to wait before trying again, when the answer said. */
  retryAfterS: number | null;
  /** The envelope's `error` object, when the answer carried one. */
  readonly error: api.ToolError | null;
  /** Whether the same request may succeed later. */
  readonly retryable: boolean;
  static fromEnvelope(envelope: unknown, status: number | null): ToolfleetError;
}

/**
 * No answer came: the server could not be reached or the connection broke
 * (`unavailable`), or the answer or a stream's next bytes did not come in
 * time (`timeout`). `status` is `null`; the underlying error is `cause`.
 */
export declare class ToolfleetConnectionError extends ToolfleetError {
  constructor(code: "unavailable" | "timeout", message: string, cause?: unknown);
  code: "unavailable" | "timeout";
}

/** One Server-Sent Event. */
export declare class SseEvent {
  constructor(event: string, data: string, id: string | null);
  /** Its type: `job` or `ticket` (events), `run.<state>` (a run's events). */
  event: string;
  /** The data lines joined with newlines. */
  data: string;
  /** The last event id, or `null`. */
  id: string | null;
  /** `data` parsed as JSON. */
  json<T = any>(): T;
}

/** Feeds lines (without their line ending), answers each event as its closing blank line arrives. */
export declare class SseParser {
  feed(line: string): SseEvent | null;
}

/** The options of one call (the fields of `POST /v1/calls` beside `tool` and `args`). */
export interface CallOptions {
  idempotencyKey?: string;
  /** The run the call belongs to. */
  runId?: string;
  /** Where the settled job or answered ticket is POSTed, signed. */
  callbackUrl?: string;
  /** When the job runs: RFC 3339 or a `Date`. */
  runAt?: string | Date;
  delayS?: number;
  priority?: number;
  signal?: AbortSignal;
}

/** One call of a batch: `[tool, args]` or `{tool, args, ...options}`. */
export type Call =
  | readonly [tool: string, args?: Record<string, unknown>]
  | ({ tool: string; args?: Record<string, unknown> } & Omit<CallOptions, "signal">);

export interface StreamOptions {
  /** Closes the stream. */
  signal?: AbortSignal;
  /** How long to wait for the next bytes (keep-alives count) before throwing `timeout`. */
  readTimeoutS?: number;
}

/** A run's answer from the API: the run (see `api.Run`), with any field the types do not name. */
export type RunRecord = api.Run & Record<string, any>;
export type TicketRecord = api.Ticket & Record<string, any>;

export declare class Runs {
  /**
   * `POST /v1/runs`: a run of the assistant `agent` on `input`, or (with
   * `checkpoint` and no agent) a run the caller drives.
   */
  start(options: {
    agent?: string;
    input?: string;
    checkpoint?: unknown;
    callbackUrl?: string;
    idempotencyKey?: string;
  }): Promise<RunRecord>;
  /** The run, its transcript included. */
  get(runId: string): Promise<RunRecord>;
  /** `{runs, next_cursor}`, newest first, without transcripts. */
  list(options?: { state?: string; agent?: string; cursor?: string }): Promise<api.RunPage>;
  /** The run's events (`run.<state>`): the run as it stands, then each change. */
  follow(runId: string, options?: StreamOptions): AsyncGenerator<SseEvent, void, undefined>;
  /** Follows the run until it settles (or `timeoutS`, default 60): the run as it then reads. */
  waitSettled(runId: string, options?: { timeoutS?: number; signal?: AbortSignal }): Promise<RunRecord>;
  /** `POST /v1/runs/{run}/wait`: parks a run the caller drives on its jobs and tickets. */
  wait(
    runId: string,
    options: { jobs?: readonly string[]; tickets?: readonly string[]; for?: "all" | "any"; checkpoint?: unknown },
  ): Promise<RunRecord>;
  /** The user's next message to an answered run of an assistant. */
  message(runId: string, content: string): Promise<RunRecord>;
  /** Records the answer of a run the caller drives. */
  answer(runId: string, answer: string, options?: { checkpoint?: unknown }): Promise<RunRecord>;
  /** Stops a run (and cancels the jobs it waits on). */
  cancel(runId: string): Promise<RunRecord>;
}

export declare class Inbox {
  /** `GET /v1/tickets`: the tickets the caller may answer, newest first. */
  list(options?: { state?: "open" | "answered" | (string & {}); kind?: "question" | "approval"; cursor?: string }): Promise<api.TicketPage>;
  get(ticket: string): Promise<TicketRecord>;
  /** Answers a question: the answered ticket. A second answer throws `conflict`. */
  answer(ticket: string, answer: unknown): Promise<TicketRecord>;
  /** Approves the commit an approval ticket holds: it runs once, now. */
  approve(ticket: string): Promise<TicketRecord>;
  /** Rejects the commit an approval ticket holds. */
  reject(ticket: string, options?: { reason?: string }): Promise<TicketRecord>;
}

export interface ToolfleetOptions {
  /** The server's root (default `http://127.0.0.1:8080`). */
  baseUrl?: string;
  /** The bearer token. */
  token?: string | null;
  /** A `fetch` of one's own (default `globalThis.fetch`). */
  fetch?: (input: string, init: RequestInit) => Promise<Response>;
  /** Headers sent with every request. */
  headers?: Record<string, string>;
  /** The timeout of one request, in seconds (default 30). */
  timeoutS?: number;
}

/** A client of one toolfleet server, as one principal (its bearer token). */
export declare class Toolfleet {
  constructor(options?: ToolfleetOptions);
  readonly baseUrl: string;
  readonly token: string | null;
  readonly runs: Runs;
  readonly inbox: Inbox;

  /** `GET /v1/tools?format=F`: the specs the caller may call, in that format. */
  tools(format?: "neutral"): Promise<ToolSpec[]>;
  tools(format: ToolFormat): Promise<any>;
  /** Calls `tool`: its envelope, a tool's `error` included. */
  call<Result = any>(tool: string, args?: Record<string, unknown>, options?: CallOptions): Promise<Envelope<Result>>;
  /** Makes every call in one request (1 to 1,000): an envelope each, in order. */
  callMany(calls: Iterable<Call>, options?: { signal?: AbortSignal }): Promise<Envelope[]>;
  /** Calls `tool` and, when it started a job, waits up to `timeoutS` (default 60) for it. */
  callAndWait<Result = any>(
    tool: string,
    args?: Record<string, unknown>,
    options?: CallOptions & { timeoutS?: number },
  ): Promise<Envelope<Result>>;
  /** `get_job`: the job's envelope; with `waitS` (0 to 30) waits up to that long for it to settle. */
  getJob<Result = any>(jobId: string, options?: { waitS?: number; signal?: AbortSignal }): Promise<Envelope<Result>>;
  /** Long-polls `getJob` until the job settles or `timeoutS` (default 60) passes. */
  waitJob<Result = any>(jobId: string, options?: { timeoutS?: number; signal?: AbortSignal }): Promise<Envelope<Result>>;
  /** Cancels a job that has not settled: its envelope as it now stands. */
  cancelJob(jobId: string): Promise<Envelope>;
  /** `GET /v1/jobs`: `{jobs, next_cursor}`, newest first. */
  listJobs(options?: { state?: string; tool?: string; limit?: number; cursor?: string }): Promise<api.JobPage>;
  /** `GET /v1/events`: the caller's jobs' and tickets' events as they come. */
  events(options?: StreamOptions & { states?: string | readonly string[] }): AsyncGenerator<SseEvent, void, undefined>;
}

export declare const SIGNATURE_HEADER: "Toolfleet-Signature";
export declare const DELIVERY_HEADER: "Toolfleet-Delivery";

/** Bytes or text, as a webhook's secret or body. */
export type BytesLike = string | ArrayBuffer | ArrayBufferView;

/** A webhook's headers: a `Headers`, a `Map`, or a plain object such as Node's `req.headers`. */
export type HeadersLike =
  | { get(name: string): string | null | undefined }
  | Record<string, string | string[] | undefined>;

/** The `Toolfleet-Signature` header value toolfleet sends for `body` at Unix time `t` (seconds). */
export declare function signWebhook(secret: BytesLike, t: number, body: BytesLike): Promise<string>;

/**
 * Whether `body` (the raw request body, as received) carries a valid
 * `Toolfleet-Signature` under `secret`, signed within `toleranceS` (default
 * 300, `null` for any time) of `now` (Unix seconds, default the clock).
 */
export declare function verifyWebhook(
  secret: BytesLike,
  headers: HeadersLike,
  body: BytesLike,
  options?: { toleranceS?: number | null; now?: number },
): Promise<boolean>;
