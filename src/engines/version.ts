// The oldest SGLang and vLLM the clients are written for, and the check each engine makes when it first reads its
// server. README ("Supported engine versions") says why each is the minimum.

export const MIN_VERSION = {
  // sampling_seed (PR 10678) and --enable-deterministic-inference; before it sampling_seed is an HTTP 500, and
  // older builds still take a singular name/dtype/shape in update_weights_from_distributed
  sglang: '0.5.3',
  // return_token_ids on /v1/completions and --logprobs-mode
  vllm: '0.10.2',
} as const;

/** major, minor, patch of a version string ('0.5.3rc2' → [0, 5, 3]); null when it has none. */
export function parseVersion(v: string): [number, number, number] | null {
  const m = /^v?(\d+)\.(\d+)(?:\.(\d+))?/.exec(v.trim());
  return m ? [Number(m[1]), Number(m[2]), Number(m[3] ?? 0)] : null;
}

function below(a: [number, number, number], b: [number, number, number]): boolean {
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i] < b[i];
  return false;
}

/**
 * Throws when `version` is older than the product's minimum, naming both. Returns a note when it cannot tell: no
 * version reported, or a source build without release tags (setuptools-scm writes '0.1.devN' there).
 */
export function checkVersion(
  name: string,
  product: keyof typeof MIN_VERSION,
  version: unknown,
): string | undefined {
  const min = MIN_VERSION[product];
  if (typeof version !== 'string' || version === '')
    return `${name}: the server reports no version; rstar2 supports ${product} ${min} and later`;
  const v = parseVersion(version);
  if (!v || /^0\.1\.dev/.test(version))
    return `${name}: cannot tell what ${product} '${version}' is (a source build?); rstar2 supports ${min} and later`;
  if (below(v, parseVersion(min) as [number, number, number]))
    throw new Error(
      `${name}: ${product} ${version} is older than ${min}, the oldest rstar2 supports; upgrade the server`,
    );
  return undefined;
}
