export { appendJsonl, readJsonl, readJsonlTolerant, streamJsonl } from './jsonl.js';
export { Progress } from './progress.js';
export { findPython, PYTHON_DIR, projectVenv } from './python.js';
export { Rng } from './rng.js';
export { sleep } from './sleep.js';
export { startThread } from './thread.js';
