// Asserts that a promise rejects with a ToolfleetError, answering it.

import assert from "node:assert/strict";

import { ToolfleetError } from "../../src/index.js";

/** Asserts that `promise` rejects with a `ToolfleetError`, answering it. */
export async function refused(promise) {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof ToolfleetError, `not a ToolfleetError: ${error?.stack ?? error}`);
    return error;
  }
  assert.fail("it did not throw");
}
