// The oldest SGLang and vLLM the clients are written for, and the check each engine makes when it first reads its
// server. docs/ENGINES.md ("SGLang and vLLM: supported versions") says why each is the minimum; test/engines/server-specs.ts cites the
// upstream source of each.

export const MIN_VERSION = {
  // sampling_seed (PR 10678, e2ac7888, first tagged in v0.5.3rc2; v0.5.3rc0 and rc1, which both report
  // '0.5.3rc0', lack it) and --enable-deterministic-inference; before it sampling_seed is an HTTP 500, and builds
  // before v0.4.9 take a singular name/dtype/shape in update_weights_from_distributed
  sglang: '0.5.3',
  // return_token_ids on /v1/completions (PR 22587, 24f4d1a2, first tagged in v0.10.2rc1); --logprobs-mode is
  // older (v0.10.0)
  vllm: '0.10.2',
} as const;

type Parsed = { release: [number, number, number]; pre: boolean };

/**
 * major, minor, patch of a version string ('0.5.3rc2' → [0, 5, 3]) and whether it is a pre-release of that
 * (rcN, aN, bN, .devN: PEP 440 orders each below the release itself; .postN and +local do not); null when it has
 * no version number.
 */
export function parseVersion(v: string): Parsed | null {
  const m = /^v?(\d+)\.(\d+)(?:\.(\d+))?(.*)$/.exec(v.trim());
  if (!m) return null;
  const rest = m[4].split('+')[0];
  return {
    release: [Number(m[1]), Number(m[2]), Number(m[3] ?? 0)],
    pre: /^(?:\.post\d+)?(?:[-_.]?(?:a|b|rc|alpha|beta|pre|preview)\d*|[-_.]?dev\d*)/i.test(rest),
  };
}

function below(a: Parsed, b: Parsed): boolean {
  for (let i = 0; i < 3; i++) if (a.release[i] !== b.release[i]) return a.release[i] < b.release[i];
  return a.pre && !b.pre;
}

// What a source build without release tags reports: setuptools-scm's '0.1.devN+g<sha>' (vLLM; SGLang from v0.5.7),
// SGLang's '0.0.0.dev0' without git metadata (python/sglang/version.py's fallback from v0.5.7, pyproject's
// fallback_version from v0.5.8); vLLM's 'dev' in that case has no number at all
const UNTAGGED = /^(?:0\.1\.dev|0\.0\.0\.dev)/;

/**
 * Throws when `version` is older than the product's minimum, naming both. Returns a note when it cannot tell: no
 * version reported, or a source build without release tags.
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
  if (!v || UNTAGGED.test(version))
    return `${name}: cannot tell what ${product} '${version}' is (a source build?); rstar2 supports ${min} and later`;
  if (below(v, parseVersion(min) as Parsed))
    throw new Error(
      `${name}: ${product} ${version} is older than ${min}, the oldest rstar2 supports; upgrade the server`,
    );
  return undefined;
}
