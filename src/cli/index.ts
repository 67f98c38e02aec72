// The door of cli/: the shared option vocabulary every `<folder>/cli.ts` registers its commands with. program.ts
// and main.ts are entry points and stay out: program.ts imports every `<folder>/cli.ts`, so exporting it here
// would close a cycle through each of them.
export {
  AliasOption,
  commaList,
  commandPath,
  deprecatedAliases,
  float,
  int,
  type NumberParser,
  nonNegativeInt,
  port,
  positiveInt,
  seed,
  topK,
} from './options.js';
