import { PYTHON_TOOL_NAME, parseToolCalls, type ToolSpec } from '../tokenizer/index.js';
import { kindOf, readRows, resolveFiles } from './files.js';

// SFT data: conversations in OpenAI's chat format, ShareGPT's, xLAM's function-calling rows, or instruction rows
// turned into one. ChatExample is what the SFT stage renders (data/sft.ts); chatSegments gives the assistant and
// tool turns as the text a rollout contains, so demonstrations and the policy's own samples tokenize the same way.

export const ROLES = ['system', 'user', 'assistant', 'tool'] as const;
export type Role = (typeof ROLES)[number];

export interface ToolCall {
  type: 'function';
  id?: string;
  function: { name: string; arguments: Record<string, unknown> }; // JSON-string arguments arrive parsed
}

// Structurally a tokenizer ChatMessage, so examples render through ChatTemplate as they are.
export interface Message {
  role: Role;
  content: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  /** OpenAI fine-tuning's per-message switch, assistant messages only: 0 shows the turn without training it. */
  weight?: 0 | 1;
}

export interface ChatExample {
  messages: Message[];
  /** The row's own tools (OpenAI `tools`), in its source's order and wording; absent when it gives none. */
  tools?: ToolSpec[];
}

export const SFT_LAYOUTS = [
  'messages',
  'sharegpt',
  'xlam',
  'alpaca',
  'prompt-response',
  'question-answer',
] as const;
export type SftLayout = (typeof SFT_LAYOUTS)[number];

const SFT_HELP =
  'messages ({messages: [{role, content, tool_calls?}], tools?}), sharegpt ({conversations: [{from, value}], ' +
  'system?, tools?}), xlam ({query, tools, answers}), alpaca ({instruction, input?, output}), ' +
  'prompt-response ({prompt, response}), question-answer ({question, answer_text})';

export function detectSftLayout(row: Record<string, unknown>): SftLayout | null {
  if ('messages' in row) return 'messages';
  if ('conversations' in row) return 'sharegpt';
  if ('query' in row && 'answers' in row) return 'xlam';
  if ('instruction' in row && 'output' in row) return 'alpaca';
  if ('prompt' in row && 'response' in row) return 'prompt-response';
  if ('question' in row && 'answer_text' in row) return 'question-answer';
  return null;
}

function str(row: Record<string, unknown>, key: string, where: string): string {
  const v = row[key];
  if (typeof v !== 'string' || v.trim() === '') {
    throw new Error(`${where}: field '${key}' must be a non-empty string, got ${kindOf(v)}`);
  }
  return v;
}

// Datasets on the Hub keep nested fields as JSON strings (xLAM's tools and answers, ShareGPT's tools).
function parsed(v: unknown, at: string): unknown {
  if (typeof v !== 'string') return v;
  try {
    return JSON.parse(v);
  } catch (e) {
    throw new Error(`${at}: not valid JSON (${(e as Error).message})`);
  }
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * A row's tools: OpenAI's `{type: 'function', function: {name, …}}` entries, or bare functions `{name,
 * description, parameters}` (xLAM, Glaive), which are wrapped. Each is kept as written otherwise: the template
 * shows the model what the dataset wrote. None, null and [] are no tools.
 */
function toolsOf(v: unknown, at: string): ToolSpec[] | undefined {
  const list = parsed(v ?? null, at);
  if (list === null) return undefined;
  if (!Array.isArray(list)) throw new Error(`${at}: must be a list of tools, got ${kindOf(list)}`);
  const tools = list.map((t, i): ToolSpec => {
    const fn = isObject(t) && t.type === 'function' ? t.function : t;
    if (!isObject(fn) || typeof fn.name !== 'string' || fn.name === '')
      throw new Error(
        `${at}[${i}]: expected {type: 'function', function: {name, description?, parameters?}} or {name, description?, parameters?}, got ${kindOf(t)}`,
      );
    return isObject(t) && t.type === 'function'
      ? (t as unknown as ToolSpec)
      : { type: 'function', function: fn as ToolSpec['function'] };
  });
  return tools.length > 0 ? tools : undefined;
}

function toolCall(v: unknown, at: string): ToolCall {
  const c = (typeof v === 'object' && v !== null ? v : {}) as Record<string, unknown>;
  const fn = c.function as Record<string, unknown> | undefined;
  if (typeof fn !== 'object' || fn === null || typeof fn.name !== 'string' || fn.name === '') {
    throw new Error(`${at}: expected {type: 'function', function: {name, arguments}}, got ${kindOf(v)}`);
  }
  if (c.type !== undefined && c.type !== 'function') {
    throw new Error(`${at}.type: only 'function' tool calls exist here, got ${JSON.stringify(c.type)}`);
  }
  const args = parsed(fn.arguments ?? {}, `${at}.function.arguments`);
  if (!isObject(args)) {
    throw new Error(`${at}.function.arguments: must be a JSON object, got ${kindOf(args)}`);
  }
  const call: ToolCall = { type: 'function', function: { name: fn.name, arguments: args } };
  if (typeof c.id === 'string') call.id = c.id;
  return call;
}

function message(v: unknown, at: string): Message {
  if (!isObject(v)) throw new Error(`${at}: expected an object, got ${kindOf(v)}`);
  const m = v;
  if (!(ROLES as readonly unknown[]).includes(m.role)) {
    throw new Error(`${at}.role: must be one of ${ROLES.join(', ')}, got ${JSON.stringify(m.role)}`);
  }
  const role = m.role as Role;
  const calls = m.tool_calls ?? [];
  if (!Array.isArray(calls)) throw new Error(`${at}.tool_calls: must be a list, got ${kindOf(calls)}`);
  if (calls.length > 0 && role !== 'assistant')
    throw new Error(`${at}.tool_calls: only assistant messages call tools`);
  // OpenAI sends content: null on an assistant turn that only calls tools, and its fine-tuning files leave it out
  const content = m.content ?? (calls.length > 0 ? '' : undefined);
  if (typeof content !== 'string') throw new Error(`${at}.content: must be a string, got ${kindOf(content)}`);
  const out: Message = { role, content };
  if (calls.length > 0) out.tool_calls = calls.map((c, i) => toolCall(c, `${at}.tool_calls[${i}]`));
  if (role === 'tool' && typeof m.tool_call_id === 'string') out.tool_call_id = m.tool_call_id;
  if (m.weight !== undefined && m.weight !== null) {
    if (m.weight !== 0 && m.weight !== 1)
      throw new Error(
        `${at}.weight: must be 0 or 1 (OpenAI's fine-tuning format), got ${JSON.stringify(m.weight)}`,
      );
    if (role !== 'assistant')
      throw new Error(`${at}.weight: only assistant messages are weighted, not ${role}`);
    out.weight = m.weight;
  }
  return out;
}

// ShareGPT's speaker names (LLaMA-Factory's defaults: human, gpt, observation, function_call, system) and the
// plain role names some files use instead (Hermes function-calling: tool).
const SHAREGPT_ROLES: Record<string, Role | 'function_call'> = {
  human: 'user',
  user: 'user',
  gpt: 'assistant',
  assistant: 'assistant',
  system: 'system',
  observation: 'tool',
  tool: 'tool',
  function_call: 'function_call',
};

function sharegptTurn(v: unknown, at: string): Message {
  if (!isObject(v)) throw new Error(`${at}: expected {from, value}, got ${kindOf(v)}`);
  const role = typeof v.from === 'string' ? SHAREGPT_ROLES[v.from] : undefined;
  if (!role)
    throw new Error(
      `${at}.from: must be one of ${Object.keys(SHAREGPT_ROLES).join(', ')}, got ${JSON.stringify(v.from)}`,
    );
  if (typeof v.value !== 'string') throw new Error(`${at}.value: must be a string, got ${kindOf(v.value)}`);
  if (role !== 'function_call') return { role, content: v.value };
  // a function_call turn's value is the call as JSON, {name, arguments}, or a list of them (parallel calls)
  const call = parsed(v.value, `${at}.value`);
  const calls = Array.isArray(call) ? call : [call];
  if (calls.length === 0) throw new Error(`${at}.value: a function_call turn with no call`);
  return {
    role: 'assistant',
    content: '',
    tool_calls: calls.map((c, i) =>
      toolCall({ function: c }, `${at}.value${Array.isArray(call) ? `[${i}]` : ''}`),
    ),
  };
}

/** One SFT row (any SftLayout) → a checked ChatExample; errors name `where` and the field. */
export function chatExampleFromRow(row: Record<string, unknown>, where: string): ChatExample {
  const layout = detectSftLayout(row);
  let messages: Message[];
  let tools: ToolSpec[] | undefined;
  switch (layout) {
    case null:
      throw new Error(
        `${where}: unknown SFT layout; fields seen: ${Object.keys(row).join(', ') || '(none)'}; tried ${SFT_HELP}`,
      );
    case 'messages': {
      if (!Array.isArray(row.messages))
        throw new Error(`${where}: field 'messages' must be a list, got ${kindOf(row.messages)}`);
      messages = row.messages.map((m, i) => message(m, `${where}: messages[${i}]`));
      tools = toolsOf(row.tools, `${where}: tools`);
      break;
    }
    case 'sharegpt': {
      if (!Array.isArray(row.conversations))
        throw new Error(`${where}: field 'conversations' must be a list, got ${kindOf(row.conversations)}`);
      messages = row.conversations.map((m, i) => sharegptTurn(m, `${where}: conversations[${i}]`));
      // LLaMA-Factory's `system` column; a system turn in the conversation overrides it
      if (typeof row.system === 'string' && row.system !== '' && messages[0]?.role !== 'system')
        messages.unshift({ role: 'system', content: row.system });
      tools = toolsOf(row.tools, `${where}: tools`);
      break;
    }
    case 'xlam': {
      const answers = parsed(row.answers, `${where}: answers`);
      if (!Array.isArray(answers) || answers.length === 0)
        throw new Error(
          `${where}: field 'answers' must be a non-empty list of calls {name, arguments}, got ${kindOf(answers)}`,
        );
      messages = [
        { role: 'user', content: str(row, 'query', where) },
        {
          role: 'assistant',
          content: '',
          tool_calls: answers.map((a, i) => toolCall({ function: a }, `${where}: answers[${i}]`)),
        },
      ];
      tools = toolsOf(row.tools, `${where}: tools`);
      break;
    }
    case 'alpaca': {
      const input = row.input === undefined || row.input === null ? '' : String(row.input);
      const instruction = str(row, 'instruction', where);
      const user = input.trim() === '' ? instruction : `${instruction}\n\n${input}`;
      messages = [
        { role: 'user', content: user },
        { role: 'assistant', content: str(row, 'output', where) },
      ];
      break;
    }
    case 'prompt-response':
      messages = [
        { role: 'user', content: str(row, 'prompt', where) },
        { role: 'assistant', content: str(row, 'response', where) },
      ];
      break;
    case 'question-answer':
      messages = [
        { role: 'user', content: str(row, 'question', where) },
        { role: 'assistant', content: str(row, 'answer_text', where) },
      ];
      break;
  }
  try {
    checkConversation(messages);
  } catch (e) {
    throw new Error(`${where}: ${(e as Error).message}`);
  }
  return tools ? { messages, tools } : { messages };
}

/** Whether an assistant message calls a tool: tool_calls, or `<tool_call>` blocks written in its text (Hermes). */
const callsTool = (m: Message) => (m.tool_calls?.length ?? 0) > 0 || parseToolCalls(m.content).length > 0;

/**
 * What every rendering needs of a conversation: a user message before the first assistant message, something
 * in every assistant message, and tool messages only after an assistant message that calls a tool (or after
 * each other). A conversation may go on after an answer (a user message after an assistant one) and may end on
 * a call (function-calling data that stops at the call).
 */
export function checkConversation(msgs: readonly Message[]): void {
  const start = msgs.findIndex((m) => m.role === 'assistant');
  if (start < 0) throw new Error('no assistant message to learn from');
  const stray = msgs.slice(0, start).findIndex((m) => m.role === 'tool');
  if (stray >= 0) throw new Error(`messages[${stray}]: tool message before the first assistant message`);
  if (!msgs.slice(0, start).some((m) => m.role === 'user'))
    throw new Error('no user message before the first assistant message');
  if (msgs.every((m) => m.role !== 'assistant' || m.weight === 0))
    throw new Error('no assistant message to learn from: every one has weight 0');
  msgs.forEach((m, i) => {
    if (m.role === 'assistant' && m.content === '' && !m.tool_calls?.length)
      throw new Error(`messages[${i}]: empty assistant message`);
    if (m.role !== 'tool') return;
    const prev = msgs[i - 1];
    if (!prev || !(prev.role === 'tool' || (prev.role === 'assistant' && callsTool(prev))))
      throw new Error(`messages[${i}]: tool message without a tool call before it`);
  });
}

/**
 * The names of the tools an example's assistant messages call, once per call: tool_calls, and `<tool_call>`
 * blocks in the text. A block that is not JSON (Hermes' data writes Python dicts, `{'name': 'f', …}`) gives its
 * name by its `name` key; one without any gives ''.
 */
export function calledToolNames(ex: ChatExample): string[] {
  const out: string[] = [];
  for (const m of ex.messages) {
    if (m.role !== 'assistant') continue;
    for (const c of m.tool_calls ?? []) out.push(c.function.name);
    for (const [, block] of m.content.matchAll(/<tool_call>([\s\S]*?)<\/tool_call>/g)) {
      let name: unknown;
      try {
        name = (JSON.parse(block) as { name?: unknown }).name;
      } catch {
        name = /["']name["']\s*:\s*["']([^"']*)["']/.exec(block)?.[1];
      }
      out.push(typeof name === 'string' ? name : '');
    }
  }
  return out;
}

/** SFT examples from JSONL or Parquet files (path, directory or glob); every row is checked as it is read. */
export async function loadChatExamples(
  spec: string,
  opts: { limit?: number; layouts?: Partial<Record<SftLayout, number>> } = {},
): Promise<ChatExample[]> {
  const out: ChatExample[] = [];
  for await (const { row, where } of readRows(resolveFiles(spec, 'examples'))) {
    out.push(chatExampleFromRow(row, where));
    if (opts.layouts) {
      const l = detectSftLayout(row) as SftLayout;
      opts.layouts[l] = (opts.layouts[l] ?? 0) + 1;
    }
    if (opts.limit !== undefined && out.length >= opts.limit) break;
  }
  if (out.length === 0) throw new Error(`no examples: ${spec} has no rows`);
  return out;
}

/**
 * How tool calls are written out:
 * - 'compact': JSON.stringify({name, arguments}), the text the quickstart's demos teach (recipe toolCallText),
 *   so SFT data and the rollouts of a model trained on it match token for token. Default.
 * - 'template': what the shipped chat templates (Qwen/Hermes tool format) render for a tool_calls message,
 *   `{"name": "N", "arguments": ` + Python json.dumps separators; for models pretrained on that format.
 */
export type ToolCallStyle = 'compact' | 'template';

// Python's json.dumps (and Jinja's tojson) with its default ', ' and ': ' separators.
function pyJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(pyJson).join(', ')}]`;
  if (typeof v === 'object' && v !== null) {
    return `{${Object.entries(v)
      .filter(([, x]) => x !== undefined)
      .map(([k, x]) => `${JSON.stringify(k)}: ${pyJson(x)}`)
      .join(', ')}}`;
  }
  return JSON.stringify(v);
}

/**
 * One `<tool_call>` block as the model writes it. Python-tool arguments are put in the order rollouts use,
 * code then input, with input '' when absent (as recipe toolCallText writes every call).
 */
export function toolCallBlock(
  name: string,
  args: Record<string, unknown>,
  style: ToolCallStyle = 'compact',
): string {
  const { code, input, ...rest } = args;
  const a = name === PYTHON_TOOL_NAME ? { code, input: input ?? '', ...rest } : args;
  const json =
    style === 'compact'
      ? JSON.stringify({ name, arguments: a })
      : `{"name": "${name}", "arguments": ${pyJson(a)}}`;
  return `<tool_call>\n${json}\n</tool_call>`;
}

/** A turn after the prompt: generated text (trained on unless its message has weight 0) or the tool responses
 *  the loop appends (masked). */
export type ChatSegment =
  | { role: 'assistant'; text: string; train: boolean }
  | { role: 'tool'; texts: string[] };

/**
 * An example as a rollout: the prompt messages (system/user before the first assistant turn), then assistant
 * turns and tool turns in order. An assistant turn's text is its content and its tool calls joined by '\n', as
 * the chat templates lay them out; it is the text after the generation prompt (for rstar2, after the
 * `<reason>` that prompt opens), without the end-of-turn token. Consecutive tool messages form one tool turn
 * (the loop answers all of a turn's calls in one user turn). Throws on a conversation a rollout cannot produce.
 */
export function chatSegments(
  ex: ChatExample,
  opts: { toolCallStyle?: ToolCallStyle } = {},
): { prompt: Message[]; segments: ChatSegment[] } {
  const msgs = ex.messages;
  const start = msgs.findIndex((m) => m.role === 'assistant');
  if (start < 0) throw new Error('no assistant message to learn from');
  const prompt = msgs.slice(0, start);
  const stray = prompt.findIndex((m) => m.role === 'tool');
  if (stray >= 0) throw new Error(`messages[${stray}]: tool message before the first assistant message`);
  if (!prompt.some((m) => m.role === 'user'))
    throw new Error('no user message before the first assistant message');
  const segments: ChatSegment[] = [];
  let callsPending = false;
  msgs.slice(start).forEach((m, k) => {
    const i = start + k;
    if (m.role === 'assistant') {
      if (callsPending)
        throw new Error(
          `messages[${i}]: assistant message where the tool responses to the calls before it belong`,
        );
      const calls = (m.tool_calls ?? []).map((c) =>
        toolCallBlock(c.function.name, c.function.arguments, opts.toolCallStyle),
      );
      const text = [m.content, ...calls].filter((s) => s !== '').join('\n');
      if (text === '') throw new Error(`messages[${i}]: empty assistant message`);
      segments.push({ role: 'assistant', text, train: m.weight !== 0 });
      callsPending = calls.length > 0 || parseToolCalls(m.content).length > 0;
    } else if (m.role === 'tool') {
      const last = segments.at(-1);
      if (last?.role === 'tool') last.texts.push(m.content);
      else if (callsPending) segments.push({ role: 'tool', texts: [m.content] });
      else throw new Error(`messages[${i}]: tool message without a tool call before it`);
      callsPending = false;
    } else {
      throw new Error(
        `messages[${i}]: ${m.role} message after the first assistant message: a rollout has one prompt, so the RL template cannot render it (render the stage with template: model or qwen, which take whole conversations)`,
      );
    }
  });
  if (callsPending)
    throw new Error(
      'the last assistant message calls a tool that never answers: a rollout runs every call, so the RL template cannot render it (template: model or qwen can)',
    );
  if (segments.at(-1)?.role !== 'assistant')
    throw new Error('the conversation ends with a tool message, not an assistant answer');
  return { prompt, segments };
}
