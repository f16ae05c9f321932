// Toolfleet's tools as tools of the Vercel AI SDK (the `ai` package): each in
// the shape its `tool()` helper makes, `{description, inputSchema, execute}`,
// so `generateText({tools: await aiSdkTools(client), ...})` calls them. The
// package does not depend on `ai`: pass its `jsonSchema` function, or let the
// adapter import `ai` when it is installed.

/** How long `execute` waits for a job before answering its `running` envelope. */
export const DEFAULT_WAIT_TIMEOUT_S = 120;

/**
 * The envelope of arguments that are not a JSON object, as toolfleet would
 * have said it.
 * @param {string} tool
 * @param {string} reason
 */
function badArguments(tool, reason) {
  return {
    status: "error",
    error: {
      code: "invalid_arguments",
      message: `the arguments of \`${tool}\` are not a JSON object (${reason}); send them as one and call again.`,
      retryable: false,
    },
  };
}

async function loadJsonSchema() {
  try {
    const ai = await import("ai");
    return ai.jsonSchema;
  } catch (error) {
    throw new Error("aiSdkTools needs the `ai` package's `jsonSchema`: install `ai`, or pass `{jsonSchema}`", {
      cause: error,
    });
  }
}

/**
 * The tools the caller may call (every one, or those of `names` in their
 * order), keyed by name. `execute(input)` calls the tool and answers its
 * envelope as JSON, a tool's error included (for the model to read); a job
 * is waited for up to `waitTimeoutS` (0 answers the `running` envelope at
 * once).
 * @param {import("./client.js").Toolfleet} client
 * @param {{jsonSchema?: (schema: object) => unknown, names?: string[], waitTimeoutS?: number, runId?: string}} [options]
 */
export async function aiSdkTools(client, options = {}) {
  const { names, waitTimeoutS = DEFAULT_WAIT_TIMEOUT_S, runId } = options;
  const jsonSchema = options.jsonSchema ?? (await loadJsonSchema());
  const specs = await client.tools("neutral");
  const byName = new Map(specs.map((spec) => [spec.name, spec]));
  const chosen = names ?? [...byName.keys()];
  const missing = chosen.filter((name) => !byName.has(name));
  if (missing.length > 0) {
    throw new Error(`toolfleet lists no tool ${missing.join(", ")} for this caller; it lists ${[...byName.keys()].sort().join(", ")}`);
  }
  /** @type {Record<string, {description: string, inputSchema: unknown, execute: (input: unknown, options?: {abortSignal?: AbortSignal}) => Promise<unknown>}>} */
  const tools = {};
  for (const name of chosen) {
    const spec = byName.get(name);
    tools[name] = {
      description: spec.description || spec.title || name,
      inputSchema: jsonSchema(spec.input_schema ?? { type: "object", properties: {} }),
      async execute(input, executeOptions = {}) {
        let args = input ?? {};
        if (typeof args === "string") {
          try {
            args = args === "" ? {} : JSON.parse(args);
          } catch (error) {
            return badArguments(name, String(error.message ?? error));
          }
        }
        if (args === null || typeof args !== "object" || Array.isArray(args)) {
          return badArguments(name, `got ${Array.isArray(args) ? "array" : args === null ? "null" : typeof args}`);
        }
        const signal = executeOptions.abortSignal;
        const started = await client.call(name, args, { runId, signal });
        if (started.running && started.job_id && waitTimeoutS > 0) {
          return (await client.waitJob(started.job_id, { timeoutS: waitTimeoutS, signal })).toJSON();
        }
        return started.toJSON();
      },
    };
  }
  return tools;
}
