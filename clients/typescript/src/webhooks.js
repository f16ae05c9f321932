// The `Toolfleet-Signature` of webhooks (docs/API.md, Webhooks).
//
// The header is `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`,
// keyed with the bytes of the tenant's webhook secret as written in the
// configuration (or as kept in `data_dir/webhook-secret`), over the raw body
// of the POST exactly as it arrived. Web Crypto only, so it runs on Node.js,
// Deno, Bun, edge runtimes and browsers alike; hence the promises.

export const SIGNATURE_HEADER = "Toolfleet-Signature";
export const DELIVERY_HEADER = "Toolfleet-Delivery";

const encoder = new TextEncoder();

/** @param {string | ArrayBuffer | ArrayBufferView} value */
function bytes(value) {
  if (typeof value === "string") return encoder.encode(value);
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  throw new TypeError("expected a string, an ArrayBuffer or a byte array");
}

function subtle() {
  const crypto = globalThis.crypto;
  if (!crypto?.subtle) throw new Error("Web Crypto (globalThis.crypto.subtle) is not available");
  return crypto.subtle;
}

/**
 * @param {string | ArrayBuffer | ArrayBufferView} secret
 * @param {string} t
 * @param {string | ArrayBuffer | ArrayBufferView} body
 */
async function mac(secret, t, body) {
  const key = await subtle().importKey("raw", bytes(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const head = encoder.encode(`${t}.`);
  const rest = bytes(body);
  const message = new Uint8Array(head.length + rest.length);
  message.set(head);
  message.set(rest, head.length);
  const digest = new Uint8Array(await subtle().sign("HMAC", key, message));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * The header value toolfleet sends for `body` at Unix time `t` (seconds).
 * @param {string | ArrayBuffer | ArrayBufferView} secret
 * @param {number} t
 * @param {string | ArrayBuffer | ArrayBufferView} body
 */
export async function signWebhook(secret, t, body) {
  return `t=${t},v1=${await mac(secret, String(t), body)}`;
}

/** @param {any} headers @param {string} name @returns {string | null} */
function header(headers, name) {
  if (!headers || typeof headers !== "object") return null;
  if (typeof headers.get === "function") {
    const value = headers.get(name);
    if (value !== null && value !== undefined) return first(value);
    if (headers instanceof Map) {
      for (const [key, val] of headers) if (String(key).toLowerCase() === name.toLowerCase()) return first(val);
    }
    return null;
  }
  for (const [key, value] of Object.entries(headers)) {
    if (key.toLowerCase() === name.toLowerCase() && value !== undefined && value !== null) return first(value);
  }
  return null;
}

/** @param {unknown} value */
function first(value) {
  return Array.isArray(value) ? String(value[0]) : String(value);
}

/** Compares two strings in time that depends on their length alone. */
function equal(a, b) {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * Whether `body` (the raw request body, as received) carries a valid
 * `Toolfleet-Signature` in `headers` (a `Headers`, a `Map`, or a plain
 * object such as Node's `req.headers`; names compared without case) under
 * `secret`. With `toleranceS` (default 300; `null` turns it off) the
 * signature's `t` must also be within that many seconds of `now` (Unix
 * seconds, default the clock), so a recorded notice cannot be replayed later.
 * @param {string | ArrayBuffer | ArrayBufferView} secret
 * @param {any} headers
 * @param {string | ArrayBuffer | ArrayBufferView} body
 * @param {{toleranceS?: number | null, now?: number}} [options]
 * @returns {Promise<boolean>}
 */
export async function verifyWebhook(secret, headers, body, options = {}) {
  const { toleranceS = 300, now } = options;
  const value = header(headers, SIGNATURE_HEADER);
  if (!value) return false;
  /** @type {string | null} */
  let t = null;
  /** @type {string[]} */
  const signatures = [];
  for (const part of value.split(",")) {
    const trimmed = part.trim();
    const eq = trimmed.indexOf("=");
    if (eq < 0) continue;
    const key = trimmed.slice(0, eq);
    const val = trimmed.slice(eq + 1);
    if (key === "t") t = val;
    else if (key === "v1") signatures.push(val);
  }
  if (t === null || !/^[0-9]+$/.test(t) || signatures.length === 0) return false;
  if (toleranceS !== null && toleranceS !== undefined) {
    const clock = now ?? Date.now() / 1000;
    if (Math.abs(clock - Number(t)) > toleranceS) return false;
  }
  const expected = await mac(secret, t, body);
  let valid = false;
  for (const signature of signatures) valid = equal(expected, signature.toLowerCase()) || valid;
  return valid;
}
