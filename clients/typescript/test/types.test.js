// The declarations (src/*.d.ts) type-check as a caller uses them
// (test/types/usage.ts), on the `ai` package's own types, with `tsc --strict`.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { PACKAGE } from "./support/server.js";
import { MODULES, skipWithout } from "./support/toolchain.js";

test("the declarations type-check", { skip: skipWithout("typescript") || skipWithout("ai") }, () => {
  const directory = mkdtempSync(join(tmpdir(), "toolfleet-tsc-"));
  try {
    const config = join(directory, "tsconfig.json");
    writeFileSync(
      config,
      JSON.stringify({
        extends: join(PACKAGE, "test", "types", "tsconfig.json"),
        compilerOptions: { paths: { ai: [join(MODULES, "ai", "dist", "index.d.ts")] } },
        files: [join(PACKAGE, "test", "types", "usage.ts")],
      }),
    );
    const tsc = spawnSync(join(MODULES, ".bin", "tsc"), ["-p", config], { encoding: "utf8" });
    assert.equal(tsc.status, 0, `tsc failed:\n${tsc.stdout}${tsc.stderr}${tsc.error ?? ""}`);
  } finally {
    rmSync(directory, { recursive: true, force: true });
  }
});
