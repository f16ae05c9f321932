// The schemas of toolfleet's HTTP API are types only: see openapi.d.ts.
export {};
