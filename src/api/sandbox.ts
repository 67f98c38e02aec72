// Public entry point `rstar2/sandbox`: running Python in isolation. `SandboxClient` talks to a sandbox
// service over HTTP (`rstar2 sandbox serve`); `SandboxPool` is the embedded, warm bubblewrap pool that the
// service itself uses; `ShardedPool` runs several of them side by side, one per 4 cores. All implement `CodeRunner`
// (`run`, `runBatch`, `close`).
export * from '../sandbox/index.js';
