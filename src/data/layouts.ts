// Problem row layouts, apart from the code that reads them so that the CLI can list them without loading it.

export const LAYOUTS = ['verl', 'dapo', 'plain'] as const;
export type Layout = (typeof LAYOUTS)[number];

export function isLayout(s: string): s is Layout {
  return (LAYOUTS as readonly string[]).includes(s);
}

// How an SFT stage renders its examples (data/sft.ts): as rollouts of the RL template, or whole conversations
// through the model's own chat template or Qwen's.
export const SFT_TEMPLATES = ['rl', 'model', 'qwen'] as const;
export type SftTemplate = (typeof SFT_TEMPLATES)[number];
