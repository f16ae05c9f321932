// Server-Sent Events, read line by line (the WHATWG event stream format).

/**
 * One event of a stream: `event` (its type, `message` when the stream named
 * none), `data` (the data lines joined with newlines) and `id` (the last
 * event id, or `null`).
 */
export class SseEvent {
  /**
   * @param {string} event
   * @param {string} data
   * @param {string | null} id
   */
  constructor(event, data, id) {
    this.event = event;
    this.data = data;
    this.id = id;
  }

  /** `data` parsed as JSON. */
  json() {
    return JSON.parse(this.data);
  }
}

/**
 * Feeds lines (without their line ending), answers each event as its closing
 * blank line arrives. Comments (`:` lines, the keep-alives) and unknown
 * fields are skipped.
 */
export class SseParser {
  constructor() {
    this.type = "";
    /** @type {string[]} */
    this.data = [];
    /** @type {string | null} */
    this.id = null;
  }

  /** @param {string} line @returns {SseEvent | null} */
  feed(line) {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.type = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id" && !value.includes("\0")) this.id = value;
    return null;
  }

  dispatch() {
    if (this.data.length === 0) {
      this.type = "";
      return null;
    }
    const event = new SseEvent(this.type || "message", this.data.join("\n"), this.id);
    this.type = "";
    this.data = [];
    return event;
  }
}

/**
 * The lines of a byte stream, split at CRLF, LF or CR.
 * @param {AsyncIterable<string>} chunks decoded text
 */
export async function* lines(chunks) {
  let buffer = "";
  for await (const chunk of chunks) {
    buffer += chunk;
    let start = 0;
    for (let i = 0; i < buffer.length; i++) {
      const c = buffer[i];
      if (c === "\n" || c === "\r") {
        // A CR at the end of the buffer may be the first half of a CRLF.
        if (c === "\r" && i === buffer.length - 1) break;
        yield buffer.slice(start, i);
        if (c === "\r" && buffer[i + 1] === "\n") i++;
        start = i + 1;
      }
    }
    buffer = buffer.slice(start);
  }
  // A CR held back at the end was a line's end after all.
  if (buffer.endsWith("\r")) yield buffer.slice(0, -1);
  else if (buffer) yield buffer;
}
