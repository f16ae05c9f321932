// The package as a caller installs it: no dependencies, its entry points.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { PACKAGE } from "./support/server.js";

test("the package has no dependencies, and its sources import none", () => {
  const manifest = JSON.parse(readFileSync(join(PACKAGE, "package.json"), "utf8"));
  assert.equal(manifest.type, "module");
  for (const field of ["dependencies", "peerDependencies", "optionalDependencies", "bundleDependencies"]) {
    assert.equal(manifest[field], undefined, field);
  }
  for (const file of readdirSync(join(PACKAGE, "src")).filter((f) => f.endsWith(".js"))) {
    const source = readFileSync(join(PACKAGE, "src", file), "utf8");
    const imported = [...source.matchAll(/(?:^import\s[^;]*?from\s+|^export\s[^;]*?from\s+|import\()\s*"([^"]+)"/gms)].map((m) => m[1]);
    for (const specifier of imported) {
      // The AI SDK adapter imports `ai` itself only when it is not given `jsonSchema`.
      const allowed = specifier.startsWith("./") || (file === "ai-sdk.js" && specifier === "ai");
      assert.ok(allowed, `${file} imports ${specifier}`);
    }
  }
});

test("its entry points load by the package's name", async () => {
  const main = await import("@toolfleet/client");
  for (const name of ["Toolfleet", "Envelope", "ToolfleetError", "ToolfleetConnectionError", "SseEvent", "verifyWebhook", "signWebhook"]) {
    assert.ok(main[name], name);
  }
  const adapter = await import("@toolfleet/client/ai-sdk");
  assert.equal(typeof adapter.aiSdkTools, "function");
  await import("@toolfleet/client/openapi");
});

test("an envelope keeps its wire fields, even one named like a getter", async () => {
  const { Envelope } = await import("@toolfleet/client");
  const envelope = new Envelope({ status: "ok", result: { a: 1 }, call_id: "c", ok: "wire" });
  assert.equal(envelope.ok, "wire");
  assert.equal(envelope.settled, true);
  assert.deepEqual(JSON.parse(JSON.stringify(envelope)), { status: "ok", result: { a: 1 }, call_id: "c", ok: "wire" });
});
