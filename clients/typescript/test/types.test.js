// The declarations (src/*.d.ts) type-check as a caller uses them
// (test/types/usage.ts), on the `ai` package's own types, with `tsc --strict`;
// and the declarations alone, their own errors included.

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
    // The declarations themselves, strictly (the first pass skips .d.ts files: `ai`'s need @types/node).
    const declarations = join(directory, "declarations.json");
    writeFileSync(
      declarations,
      JSON.stringify({
        extends: join(PACKAGE, "test", "types", "tsconfig.json"),
        compilerOptions: { skipLibCheck: false },
        files: ["index.d.ts", "ai-sdk.d.ts", "openapi.d.ts"].map((f) => join(PACKAGE, "src", f)),
      }),
    );
    for (const project of [config, declarations]) {
      const tsc = spawnSync(join(MODULES, ".bin", "tsc"), ["-p", project], { encoding: "utf8" });
      assert.equal(tsc.status, 0, `tsc -p ${project} failed:\n${tsc.stdout}${tsc.stderr}${tsc.error ?? ""}`);
    }
  } finally {
    rmSync(directory, { recursive: true, force: true });
  }
});
