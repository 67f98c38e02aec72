// Public API of the tokenizer subsystem: HF tokenizer loading, tiny-tokenizer builders, chat templates and the
// token-level helpers the agent loop uses (prompt ids, tool-turn ids).
export {
  type BuildOptions,
  buildCharTokenizer,
  byteToUnicode,
  MARKER_TOKENS,
  SPECIAL_TOKENS,
  saveTokenizer,
  type TokenizerFiles,
  tokenizerFromFiles,
  trainBpeTokenizer,
} from './build.js';
export {
  type ChatMessage,
  ChatTemplate,
  promptIds,
  type RenderOptions,
  type TextPiece,
  type ToolCall,
  type ToolTurnBoundary,
  toolTurnIds,
} from './chat.js';
export { namedTokenizerDir } from './named.js';
export { decodeFailureText, type ParsedToolCall, parseToolCalls } from './parser.js';
export {
  COMPACT_TEMPLATE,
  QWEN_TEMPLATE,
  RSTAR2_SYSTEM_PROMPT,
  RSTAR2_TEMPLATE,
  RSTAR2_USER_PREFIX,
  TEMPLATE_NAMES,
  TEMPLATES,
  type TemplateName,
} from './templates.js';
export {
  asTransformersLoads,
  type DecodeOptions,
  StreamDecoder,
  savedChatTemplates,
  Tokenizer,
  type TokenizerConfig,
} from './tokenizer.js';
export {
  PYTHON_TOOL_NAME,
  PYTHON_TOOL_SCHEMA,
  rolloutToolSchema,
  type ToolParameter,
  type ToolSchema,
  type ToolSpec,
} from './tools.js';
