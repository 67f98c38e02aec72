export {
  type ChatExample,
  type ChatSegment,
  calledToolNames,
  chatExampleFromRow,
  chatSegments,
  checkConversation,
  detectSftLayout,
  loadChatExamples,
  type Message,
  type Role,
  SFT_LAYOUTS,
  type SftLayout,
  type ToolCall,
  type ToolCallStyle,
  toolCallBlock,
} from './chat.js';
export { getPath, readRows, readRowsSync, resolveFiles, type SourceRow } from './files.js';
export {
  dedupeQuestions,
  type FilterResult,
  integerAnswers,
  isIntegerAnswer,
  maxPromptTokens,
  normaliseQuestion,
} from './filters.js';
export {
  type DataReport,
  inspectProblems,
  type LoadOptions,
  loadProblems,
  loadProblemsSync,
} from './load.js';
export {
  DAPO_PREFIX,
  DAPO_SUFFIX,
  detectLayout,
  type FieldMap,
  isLayout,
  LAYOUTS,
  type Layout,
  type Problem,
  parseFieldMap,
  problemFromRow,
  type RowOptions,
} from './problem.js';
export {
  SFT_TEMPLATES,
  type SftRenderer,
  type SftTemplate,
  sftRenderer,
  sftTexts,
  type ToolUse,
  toolUse,
  unservedToolsWarning,
} from './sft.js';
