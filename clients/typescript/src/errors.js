// The error a refused request throws (docs/API.md, Error codes).

/**
 * A request the API refused or could not answer: a transport status (401,
 * 400, 429, 503...) or, on routes other than tool calls, an `error`
 * envelope. `code` is the envelope's error code, `message` its message,
 * `envelope` the whole JSON body when there was one, `status` the HTTP
 * status of the answer (`null` when none came).
 */
export class ToolfleetError extends Error {
  /**
   * @param {string} code
   * @param {string} message
   * @param {{status?: number | null, envelope?: any, retryAfterS?: number | null, cause?: unknown}} [options]
   */
  constructor(code, message, options = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ToolfleetError";
    this.code = code;
    this.status = options.status ?? null;
    this.envelope = options.envelope ?? null;
    this.retryAfterS = options.retryAfterS ?? null;
  }

  toString() {
    return `${this.name}: ${this.code ? `${this.code}: ` : ""}${this.message}`;
  }

  /** The envelope's `error` object, when the answer carried one. */
  get error() {
    const error = this.envelope?.error;
    return error && typeof error === "object" ? error : null;
  }

  /** Whether the same request may succeed later. */
  get retryable() {
    const error = this.error;
    if (error) return Boolean(error.retryable);
    return ["rate_limited", "timeout", "unavailable"].includes(this.code);
  }

  /**
   * The error of an `error` envelope.
   * @param {any} envelope
   * @param {number | null} status
   */
  static fromEnvelope(envelope, status) {
    const error = envelope?.error && typeof envelope.error === "object" ? envelope.error : {};
    return new ToolfleetError(String(error.code ?? "error"), String(error.message ?? ""), {
      status,
      envelope,
      retryAfterS: error.retry_after_s ?? null,
    });
  }
}

/**
 * No answer came: the server could not be reached or the connection broke
 * (code `unavailable`), or the answer or a stream's next bytes did not come
 * within the timeout (code `timeout`). `status` is `null`; the underlying
 * error is `cause`.
 */
export class ToolfleetConnectionError extends ToolfleetError {
  /**
   * @param {"unavailable" | "timeout"} code
   * @param {string} message
   * @param {unknown} [cause]
   */
  constructor(code, message, cause) {
    super(code, message, { cause });
    this.name = "ToolfleetConnectionError";
  }
}
