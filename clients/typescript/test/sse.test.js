// The event stream parser, on chunks split anywhere (no server).

import assert from "node:assert/strict";
import { test } from "node:test";

import { SseParser, lines } from "../src/sse.js";

async function events(chunks) {
  async function* source() {
    yield* chunks;
  }
  const parser = new SseParser();
  const out = [];
  for await (const line of lines(source())) {
    const event = parser.feed(line);
    if (event) out.push(event);
  }
  return out;
}

test("events split at any byte, CRLF, LF or CR, comments and unknown fields skipped", async () => {
  const text = ': keep-alive\r\nevent: job\r\nid: j1\r\ndata: {"a":\r\ndata: 1}\r\nretry: 5\r\n\r\ndata:plain\n\nevent: run.answered\rdata: x\r\r';
  const whole = await events([text]);
  assert.deepEqual(
    whole.map((e) => [e.event, e.id, e.data]),
    [
      ["job", "j1", '{"a":\n1}'],
      ["message", "j1", "plain"],
      ["run.answered", "j1", "x"],
    ],
  );
  // Any split of the same text reads the same events.
  for (let at = 1; at < text.length; at++) {
    const split = await events([text.slice(0, at), text.slice(at)]);
    assert.deepEqual(split, whole, `split at ${at}`);
  }
  const bytes = await events([...text]);
  assert.deepEqual(bytes, whole);
  assert.deepEqual(whole[0].json(), { a: 1 });
});

test("an event without data is not dispatched, nor an unfinished one", async () => {
  assert.deepEqual(await events(["event: job\n\n", "data: never ended"]), []);
});
