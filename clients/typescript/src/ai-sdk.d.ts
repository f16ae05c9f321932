// The types of @toolfleet/client/ai-sdk (src/ai-sdk.js).

import type { Toolfleet } from "./index.js";

/** How long `execute` waits for a job before answering its `running` envelope. */
export declare const DEFAULT_WAIT_TIMEOUT_S: 120;

/** A tool in the shape the `ai` package's `tool()` helper makes. */
export interface AiSdkTool<Schema = unknown> {
  description: string;
  /** What `jsonSchema` made of the tool's JSON Schema. */
  inputSchema: Schema;
  /** Calls the tool: its envelope as JSON (a job waited for), a tool's error included. */
  execute(input: any, options?: { abortSignal?: AbortSignal }): Promise<any>;
}

export interface AiSdkToolsOptions<Schema> {
  /** The `ai` package's `jsonSchema` (default: imported from `ai`). */
  jsonSchema?: (schema: any) => Schema;
  /** Which tools, in this order (default: every tool the caller may call). */
  names?: readonly string[];
  /** How long to wait for a job (default 120; 0 answers the `running` envelope). */
  waitTimeoutS?: number;
  /** The run every call belongs to. */
  runId?: string;
}

/** The tools the caller may call, keyed by name, for `generateText({tools})`. */
export declare function aiSdkTools<Schema = any>(
  client: Toolfleet,
  options?: AiSdkToolsOptions<Schema>,
): Promise<Record<string, AiSdkTool<Schema>>>;
