#!/usr/bin/env node
// Entry point: runs the TypeScript sources through tsx, so a checkout works after `npm ci` alone and
// never runs stale build output. Type errors are caught by `npm run typecheck`, not at start-up.
import { fileURLToPath, pathToFileURL } from 'node:url';
import { register } from 'tsx/esm/api';

register();
const main = fileURLToPath(new URL('../src/cli/main.ts', import.meta.url));
await import(pathToFileURL(main).href);
