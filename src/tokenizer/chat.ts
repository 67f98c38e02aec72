import { existsSync, readFileSync } from 'node:fs';
import { Template } from '@huggingface/jinja';
import { RenderLimitError, renderBounded } from './bounded.js';
import { TEMPLATE_NAMES, TEMPLATES, type TemplateName } from './templates.js';
import type { Tokenizer } from './tokenizer.js';
import type { ToolSpec } from './tools.js';

export interface ToolCall {
  type?: 'function';
  function: { name: string; arguments: Record<string, unknown> | string };
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string;
  tool_calls?: ToolCall[];
  /** 0: a turn to read, not train (turnPieces); OpenAI fine-tuning's field. */
  weight?: 0 | 1;
}

export interface RenderOptions {
  tools?: readonly ToolSpec[];
  addGenerationPrompt?: boolean;
  /** Extra template variables (HF `chat_template_kwargs`), e.g. `{ rstar2_prefix_quirk: false }`. */
  vars?: Record<string, unknown>;
}

/**
 * How tool-turn ids join the generated ids, which end with <|im_end|>:
 * - 'reference': exactly what rStar2 appends (template slice after the system block), with NO '\n' after the
 *   assistant's <|im_end|>. Default, because the released policy was trained on these sequences.
 * - 'rerender': prepend the '\n' separator a full re-render of the conversation would have.
 */
export type ToolTurnBoundary = 'reference' | 'rerender';

/** Part of a rendered conversation: text the model reads (`train` false) or writes and is trained on. */
export interface TextPiece {
  text: string;
  train: boolean;
}

const ROLES = new Set(['system', 'user', 'assistant', 'tool']);

function checkMessages(messages: readonly ChatMessage[]): void {
  if (!Array.isArray(messages)) throw new TypeError('messages must be an array');
  messages.forEach((m, i) => {
    if (!m || typeof m !== 'object') throw new TypeError(`messages[${i}] must be an object`);
    if (!ROLES.has(m.role))
      throw new Error(
        `messages[${i}].role must be one of ${[...ROLES].join(', ')}, got ${JSON.stringify(m.role)}`,
      );
    if (typeof m.content !== 'string') throw new TypeError(`messages[${i}].content must be a string`);
  });
}

/** A Jinja chat template (HF `chat_template` semantics), rendered with @huggingface/jinja. */
export class ChatTemplate {
  private readonly compiled: Template;
  private readonly systemText = new WeakMap<Tokenizer, string>();
  private readonly sliceChecked = new WeakSet<Tokenizer>();

  constructor(
    readonly source: string,
    readonly name = 'custom',
  ) {
    try {
      this.compiled = new Template(source);
    } catch (e) {
      throw new Error(`chat template ${name} does not parse: ${(e as Error).message}`);
    }
  }

  /** A shipped template: 'rstar2' (default, training template), 'qwen' (Qwen2.5/Hermes) or 'compact' (tiny models). */
  static named(name: string): ChatTemplate {
    if (!(TEMPLATE_NAMES as string[]).includes(name)) {
      throw new Error(`unknown chat template ${JSON.stringify(name)} (known: ${TEMPLATE_NAMES.join(', ')})`);
    }
    return new ChatTemplate(TEMPLATES[name as TemplateName], name);
  }

  /** The template stored with a tokenizer (chat_template.jinja, or tokenizer_config.json's `chat_template`). */
  static fromTokenizer(tokenizer: Tokenizer): ChatTemplate {
    const src = tokenizer.chatTemplate;
    if (src === undefined)
      throw new Error(
        `${tokenizer.source}: the model has no chat template (no chat_template.jinja beside it, no chat_template in its tokenizer_config.json): name one (${TEMPLATE_NAMES.join(', ')}) or a .jinja file`,
      );
    return new ChatTemplate(src, `tokenizer (${tokenizer.source})`);
  }

  /**
   * Resolve a template spec: a shipped name, 'tokenizer' (the tokenizer's own template), or a path to a
   * .jinja file or a tokenizer_config.json.
   */
  static resolve(spec: string, tokenizer?: Tokenizer): ChatTemplate {
    if ((TEMPLATE_NAMES as string[]).includes(spec)) return ChatTemplate.named(spec);
    if (spec === 'tokenizer') {
      if (!tokenizer) throw new Error("chat template 'tokenizer' needs a tokenizer");
      return ChatTemplate.fromTokenizer(tokenizer);
    }
    if (!existsSync(spec)) {
      throw new Error(
        `chat template ${JSON.stringify(spec)} is neither a name (${TEMPLATE_NAMES.join(', ')}, tokenizer) nor a file`,
      );
    }
    const text = readFileSync(spec, 'utf8');
    if (spec.endsWith('.json')) {
      let cfg: { chat_template?: unknown };
      try {
        cfg = JSON.parse(text);
      } catch (e) {
        throw new Error(`${spec} is not valid JSON: ${(e as Error).message}`);
      }
      const t = cfg.chat_template;
      const src =
        typeof t === 'string'
          ? t
          : Array.isArray(t)
            ? (t.find((x) => x?.name === 'default') ?? t[0])?.template
            : undefined;
      if (typeof src !== 'string') throw new Error(`${spec} has no chat_template`);
      return new ChatTemplate(src, spec);
    }
    return new ChatTemplate(text, spec);
  }

  render(messages: readonly ChatMessage[], opts: RenderOptions = {}): string {
    checkMessages(messages);
    return this.renderRaw(messages, opts);
  }

  // No message validation: the reference renders `[{}]` to find the system block.
  private renderRaw(messages: readonly object[], opts: RenderOptions): string {
    // raise_exception is a built-in of @huggingface/jinja; render errors are reported with the template's name.
    const vars = {
      bos_token: '',
      eos_token: '<|im_end|>',
      ...opts.vars,
      messages,
      tools: opts.tools && opts.tools.length > 0 ? opts.tools : undefined,
      add_generation_prompt: opts.addGenerationPrompt ?? false,
    };
    try {
      return renderBounded(this.compiled, vars);
    } catch (e) {
      if (e instanceof RenderLimitError) {
        throw new Error(
          `chat template ${this.name}: rendering stopped: it ${e.message}; a chat template is code that comes with the model: check it, or use a shipped template (${TEMPLATE_NAMES.join(', ')})`,
        );
      }
      throw new Error(`chat template ${this.name}: ${(e as Error).message}`);
    }
  }

  /** Prompt ids for a conversation, ending with the generation prompt (for rstar2: `<|im_start|>assistant\n<reason>`). */
  promptIds(
    tokenizer: Tokenizer,
    messages: readonly ChatMessage[],
    tools?: readonly ToolSpec[],
    vars?: Record<string, unknown>,
  ): number[] {
    const ctx = { ...tokenizer.templateVars(), ...vars };
    return tokenizer.encode(this.render(messages, { tools, addGenerationPrompt: true, vars: ctx }), {
      addSpecialTokens: false,
    });
  }

  // The tool messages (one user turn) with the generation prompt, rendered whole; starts with `system`.
  private toolTurnRender(
    toolTexts: readonly string[],
    vars: Record<string, unknown>,
    system: string,
  ): string {
    if (toolTexts.length === 0) throw new Error('toolTurnIds needs at least one tool response');
    const msgs = toolTexts.map((content) => ({ role: 'tool' as const, content }));
    const full = this.render(msgs, { addGenerationPrompt: true, vars });
    if (!full.startsWith(system)) {
      throw new Error(
        `chat template ${this.name}: rendering tool messages does not start with the system block`,
      );
    }
    return full;
  }

  /** The text of toolTurnIds: the tool turn and the next generation prompt, without the system block. */
  toolTurnText(toolTexts: readonly string[], vars: Record<string, unknown> = {}): string {
    const system = this.renderRaw([{}], { vars });
    return this.toolTurnRender(toolTexts, vars, system).slice(system.length);
  }

  /**
   * A conversation rendered whole, cut into what the model reads and what it writes: each assistant message
   * (but one with weight 0, which is read) is trained from where the generation prompt leaves off (the render of
   * the messages before it with add_generation_prompt) to its end-of-turn marker (the first of `ends` after it),
   * included. A template may
   * render a turn differently when a later one follows (Qwen3 puts an empty think block only in the last), as
   * long as the messages before each assistant turn, with the generation prompt, render as the start of the
   * whole; one that does not is refused, naming the message.
   */
  turnPieces(
    messages: readonly ChatMessage[],
    opts: { tools?: readonly ToolSpec[]; vars?: Record<string, unknown>; ends: readonly string[] },
  ): TextPiece[] {
    const { tools, vars } = opts;
    const full = this.render(messages, { tools, vars });
    const pieces: TextPiece[] = [];
    let at = 0;
    messages.forEach((m, i) => {
      if (m.role !== 'assistant') return;
      const before = this.render(messages.slice(0, i), { tools, vars, addGenerationPrompt: true });
      const start = before.length;
      if (start < at || !full.startsWith(before))
        throw new Error(
          `chat template ${this.name}: messages[${i}] (assistant): the messages before it with the generation prompt do not render as the start of the whole conversation, so its turn cannot be found`,
        );
      let end = -1;
      for (const e of opts.ends) {
        const k = full.indexOf(e, start);
        if (k >= 0 && (end < 0 || k + e.length < end)) end = k + e.length;
      }
      if (end < 0)
        throw new Error(
          `chat template ${this.name}: messages[${i}] (assistant): no end-of-turn token (${opts.ends.join(', ')}) after it`,
        );
      if (start > at) pieces.push({ text: full.slice(at, start), train: false });
      pieces.push({ text: full.slice(start, end), train: m.weight !== 0 });
      at = end;
    });
    if (at < full.length) pieces.push({ text: full.slice(at), train: false });
    return pieces;
  }

  /**
   * The ids appended after a generated turn that called tools: the reference renders the tool messages
   * (merged into one user turn) with the generation prompt, and drops the ids of the default system block
   * (the template rendered on `[{}]`).
   */
  toolTurnIds(
    tokenizer: Tokenizer,
    toolTexts: readonly string[],
    boundary: ToolTurnBoundary = 'reference',
  ): number[] {
    let system = this.systemText.get(tokenizer);
    if (system === undefined) {
      system = this.renderRaw([{}], { vars: tokenizer.templateVars() });
      this.systemText.set(tokenizer, system);
    }
    const full = this.toolTurnRender(toolTexts, tokenizer.templateVars(), system);
    const suffixIds = tokenizer.encode(full.slice(system.length), { addSpecialTokens: false });
    // The reference slices the ids of the full render. Encoding only the suffix gives the same ids when the
    // boundary falls between added tokens (it does for these templates); check that once per tokenizer.
    if (!this.sliceChecked.has(tokenizer)) {
      const systemIds = tokenizer.encode(system, { addSpecialTokens: false });
      const fullIds = tokenizer.encode(full, { addSpecialTokens: false });
      const same =
        fullIds.length === systemIds.length + suffixIds.length &&
        systemIds.every((id, i) => fullIds[i] === id) &&
        suffixIds.every((id, i) => fullIds[systemIds.length + i] === id);
      if (!same) {
        throw new Error(
          `chat template ${this.name}: the tool turn does not tokenize independently of the system block`,
        );
      }
      this.sliceChecked.add(tokenizer);
    }
    return boundary === 'rerender'
      ? [...tokenizer.encode('\n', { addSpecialTokens: false }), ...suffixIds]
      : suffixIds;
  }
}

let defaultTemplate: ChatTemplate | undefined;
function rstar2(): ChatTemplate {
  defaultTemplate ??= ChatTemplate.named('rstar2');
  return defaultTemplate;
}

/** Prompt ids with the rStar2 template unless another is given. */
export function promptIds(
  tokenizer: Tokenizer,
  messages: readonly ChatMessage[],
  tools?: readonly ToolSpec[],
  opts: { template?: ChatTemplate; vars?: Record<string, unknown> } = {},
): number[] {
  return (opts.template ?? rstar2()).promptIds(tokenizer, messages, tools, opts.vars);
}

/** Tool-turn ids with the rStar2 template unless another is given; see ChatTemplate.toolTurnIds. */
export function toolTurnIds(
  tokenizer: Tokenizer,
  toolTexts: readonly string[],
  opts: { template?: ChatTemplate; boundary?: ToolTurnBoundary } = {},
): number[] {
  return (opts.template ?? rstar2()).toolTurnIds(tokenizer, toolTexts, opts.boundary);
}
