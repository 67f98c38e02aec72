export { SandboxClient, type SandboxClientOptions } from './client.js';
export {
  type JudgeResult,
  MAX_STDOUT_ERROR_LENGTH,
  reasonOf,
  type Submission,
  type SubmissionResult,
  toSubmissionResult,
} from './codejudge.js';
export { type PoolInfo, type PoolStats, SandboxPool, type SandboxPoolOptions } from './pool.js';
export { RedisRunner, type RedisRunnerOptions, RedisWorker, type RedisWorkerOptions } from './redis.js';
export {
  type CommandRunResult,
  type RunCodeRequest,
  type RunCodeResponse,
  toRunCodeResponse,
} from './sandboxfusion.js';
export { FairQueue, SandboxServer, type SandboxServerOptions } from './server.js';
export { defaultShards, SHARDS_ENV, ShardedPool, type ShardedPoolOptions } from './shards.js';
export {
  buildToolCode,
  executePythonTool,
  executePythonToolBatch,
  formatToolText,
  PYTHON_TOOL_NAME,
  PYTHON_TOOL_SCHEMA,
  type PythonToolOptions,
  type PythonToolResult,
  type TruncateSide,
  truncateToolText,
} from './tool.js';
export type { CodeRunner, RunRequest, RunResult, RunStatus } from './types.js';
export { failedResult, MODULE_NAME } from './types.js';
