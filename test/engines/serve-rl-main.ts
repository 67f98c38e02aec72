// serve-rl-scenario.ts as its own process, for the trainer to run inside a network namespace (serve-rl.test.ts):
//   node --import tsx test/engines/serve-rl-main.ts DIR PREFIX_JSON ADDR DEV
// the engines start through PREFIX (`ip netns exec NAME`), listen on ADDR, and gloo binds DEV there.
import { type ServeProcess, startServe } from './serve-process.js';
import { SERVE_ARGS, SERVE_ENV, servedRl } from './serve-rl-scenario.js';

const [dir, prefix, addr, dev] = process.argv.slice(2);
const procs: ServeProcess[] = [];
try {
  await servedRl(dir, async (model, o) => {
    const p = await startServe(model, {
      env: { ...SERVE_ENV, GLOO_SOCKET_IFNAME: dev },
      args: SERVE_ARGS,
      host: addr,
      prefix: JSON.parse(prefix) as string[],
      ...o,
    });
    procs.push(p);
    return p;
  });
  console.log('serve-rl-main: passed');
} catch (e) {
  console.error(`serve-rl-main: ${(e as Error).stack}`);
  process.exitCode = 1;
} finally {
  await Promise.all(procs.map((p) => p.stop('SIGKILL')));
}
