// @toolfleet/client: a client of toolfleet's HTTP API (docs/API.md).

export { DEFAULT_URL, MAX_WAIT_S, RUN_SETTLED, Toolfleet } from "./client.js";
export { Envelope } from "./envelope.js";
export { ToolfleetConnectionError, ToolfleetError } from "./errors.js";
export { SseEvent, SseParser } from "./sse.js";
export { DELIVERY_HEADER, SIGNATURE_HEADER, signWebhook, verifyWebhook } from "./webhooks.js";
