// A fake SGLang or vLLM server as its own process, started with the real server's command line (the stand-in
// python of test/engines/live-engines.test.ts runs it for `-m sglang.launch_server` and
// `-m vllm.entrypoints.openai.api_server`): the flags bench/live-engines.sh passes set what the fake reports, so a
// flag left out shows as it would on the real server. Usage: fake-engine-main.ts sglang|vllm SERVER-FLAGS...
import { fakeServer } from './fake-servers.js';

const [api, ...args] = process.argv.slice(2);
if (api !== 'sglang' && api !== 'vllm') throw new Error(`fake-engine-main: sglang or vllm, not ${api}`);
const flag = (name: string) => {
  const i = args.lastIndexOf(name);
  return i < 0 ? undefined : args[i + 1];
};
const f = await fakeServer(api, undefined, Number(flag('--port') ?? 0));
f.load = { used: 0, running: 0, waiting: 0 };
// a random model's samples: a few random ids, so rewards differ within a group
f.sample = () =>
  Array.from({ length: 1 + Math.floor(Math.random() * 6) }, () => 100 + Math.floor(Math.random() * 5000));
if (api === 'sglang') {
  f.deterministic = args.includes('--enable-deterministic-inference');
  f.dtypeArg = flag('--dtype') ?? 'auto';
} else {
  f.devMode = process.env.VLLM_SERVER_DEV_MODE === '1';
  f.logprobsMode = flag('--logprobs-mode') ?? 'raw_logprobs';
  f.dtype = flag('--dtype') ?? 'bfloat16';
  f.modelPath = flag('--model') ?? f.modelPath;
}
console.log(`fake ${api} on ${f.url}`);
process.on('SIGTERM', () => void f.close().then(() => process.exit(0)));
