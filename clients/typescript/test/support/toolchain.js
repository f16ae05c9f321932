// The npm packages some tests use, kept outside the repository: TypeScript
// and the Vercel AI SDK (`ai`), installed by .ci/run under
// `TOOLFLEET_TS_DIR` (default /var/tmp/toolfleet-ts). Without them those
// tests are skipped, except under CI, where they fail.

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

export const TS_DIR = process.env.TOOLFLEET_TS_DIR || "/var/tmp/toolfleet-ts";
export const MODULES = join(TS_DIR, "node_modules");

/** Whether `package` is installed; under CI it must be. */
export function installed(what) {
  const found = existsSync(join(MODULES, what, "package.json"));
  if (!found && process.env.CI) {
    throw new Error(`${what} is not installed in ${MODULES}; .ci/run installs it, and CI never skips this test`);
  }
  return found;
}

/** The skip reason of a test that needs `what`, or false when it can run. */
export function skipWithout(what) {
  return installed(what) ? false : `${what} is not installed in ${MODULES} (.ci/run installs it)`;
}

/** Imports `specifier` (a package, or a package's subpath) from MODULES. */
export async function importFrom(name, subpath = ".") {
  const manifest = JSON.parse(readFileSync(join(MODULES, name, "package.json"), "utf8"));
  const entry = manifest.exports?.[subpath];
  const file = typeof entry === "string" ? entry : (entry?.import ?? entry?.default);
  if (!file) throw new Error(`${name} exports no ${subpath}`);
  return import(pathToFileURL(join(MODULES, name, file)).href);
}
