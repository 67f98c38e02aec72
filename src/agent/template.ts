import { ChatTemplate, PYTHON_TOOL_SCHEMA, type Tokenizer, type ToolSchema } from '../tokenizer/index.js';
import type { AgentTemplate } from './loop.js';

export interface TemplateAdapterOptions {
  chat?: ChatTemplate; // default: the rStar2 training template
  tools?: ToolSchema[]; // default: the python tool; the loop's python executor answers to their names
  vars?: Record<string, unknown>;
}

/** Binds a tokenizer and chat template into what the agent loop needs. */
export function agentTemplate(tokenizer: Tokenizer, opts: TemplateAdapterOptions = {}): AgentTemplate {
  const chat = opts.chat ?? ChatTemplate.named('rstar2');
  const tools = opts.tools ?? [PYTHON_TOOL_SCHEMA];
  const stop = [tokenizer.imEnd];
  const eos = tokenizer.eos;
  if (!stop.includes(eos)) stop.push(eos);
  return {
    promptIds: (question) =>
      chat.promptIds(tokenizer, [{ role: 'user', content: question }], tools, opts.vars),
    toolTurnIds: (texts) => chat.toolTurnIds(tokenizer, texts, 'reference'),
    decode: (ids) => tokenizer.decode(ids),
    stopTokenIds: stop,
    toolNames: tools.map((t) => t.function.name),
    turnSeparatorIds: tokenizer.encode('\n', { addSpecialTokens: false }),
  };
}
