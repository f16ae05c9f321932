// The result envelope of docs/API.md.

import { ToolfleetError } from "./errors.js";

/**
 * One tool call's (or `getJob`'s) answer: `ok`, `error`, `running` or
 * `suspended`, its wire fields as they came (`status`, `result`, `call_id`,
 * `error`, `job_id`, `poll_after_s`, `state`, `ticket`...). A tool's error is
 * a value, not an exception: a model reads it and acts on its message.
 * `JSON.stringify(envelope)` is the envelope as it came.
 */
export class Envelope {
  /** @param {Record<string, any>} raw */
  constructor(raw) {
    // Defined, not assigned: a field named like a getter below shadows it.
    for (const [key, value] of Object.entries(raw)) {
      Object.defineProperty(this, key, { value, enumerable: true, writable: true, configurable: true });
    }
    Object.defineProperty(this, "raw", { value: raw, enumerable: false });
  }

  get ok() {
    return this.status === "ok";
  }

  get isError() {
    return this.status === "error";
  }

  get running() {
    return this.status === "running";
  }

  get suspended() {
    return this.status === "suspended";
  }

  /** Whether nothing more will come of it by waiting: not `running`. */
  get settled() {
    return this.status !== "running";
  }

  toJSON() {
    return this.raw;
  }

  /** Throws a `ToolfleetError` for an `error` envelope; else answers itself. */
  raiseForError() {
    if (this.status === "error" || (this.error && typeof this.error === "object")) {
      throw ToolfleetError.fromEnvelope(this.raw, 200);
    }
    return this;
  }
}
