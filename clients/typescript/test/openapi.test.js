// src/openapi.d.ts is what scripts/gen-types.mjs makes of the OpenAPI
// document of this build of toolfleet (`toolfleet openapi`): it cannot drift.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { generate } from "../scripts/gen-types.mjs";
import { PACKAGE, toolfleetBinary } from "./support/server.js";

test("src/openapi.d.ts is generated from `toolfleet openapi`", () => {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("TOOLFLEET_")));
  const document = JSON.parse(execFileSync(toolfleetBinary(), ["openapi"], { env, encoding: "utf8" }));
  const committed = readFileSync(join(PACKAGE, "src", "openapi.d.ts"), "utf8");
  assert.equal(
    committed,
    generate(document),
    "src/openapi.d.ts is stale: run `toolfleet openapi | node clients/typescript/scripts/gen-types.mjs`",
  );
  for (const name of ["Envelope", "OkEnvelope", "ErrorEnvelope", "RunningEnvelope", "SuspendedEnvelope", "ErrorCode", "Run", "Ticket", "JobSummary"]) {
    assert.match(committed, new RegExp(`export (interface|type) ${name}\\b`), name);
  }
  assert.match(committed, /export type ErrorCode = "unknown_tool" \| "invalid_arguments"/);
});
