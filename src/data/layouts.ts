// Problem row layouts, apart from the code that reads them so that the CLI can list them without loading it.

export const LAYOUTS = ['verl', 'dapo', 'plain'] as const;
export type Layout = (typeof LAYOUTS)[number];

export function isLayout(s: string): s is Layout {
  return (LAYOUTS as readonly string[]).includes(s);
}
