import { ChatTemplate, type TextPiece, type Tokenizer, type ToolSpec } from '../tokenizer/index.js';
import {
  type ChatExample,
  calledToolNames,
  chatSegments,
  type ToolCallStyle,
  toolCallBlock,
} from './chat.js';
import type { SftTemplate } from './layouts.js';

// How an SFT stage turns chat examples into training sequences. Three templates:
// - 'rl': each example as a rollout of the recipe's RL template (its system prompt, the example's tools or else
//   the rollout tool, one user turn, tool turns as the agent loop appends them), so SFT teaches exactly what RL
//   samples. One prompt per example: a user message after the first answer is refused.
// - 'model': the model directory's own chat template (chat_template.jinja or tokenizer_config.json), the conversation
//   rendered whole;
// - 'qwen': the Qwen2.5 template, rendered whole.
// Rendered whole, every assistant message is trained from the end of its generation prompt to its end-of-turn
// token; the rest (system, user, tool turns, the template's own text) is read, not trained. Under any template
// an assistant message with `weight: 0` (OpenAI's fine-tuning format) is read, not trained.

export { SFT_TEMPLATES, type SftTemplate } from './layouts.js';

export interface SftRenderOptions {
  /** The recipe's RL chat template, which 'rl' renders with. */
  rl: ChatTemplate;
  /** Its variables (bos/eos), the model's own template and the end-of-turn tokens; without one, ChatML's. */
  tokenizer?: Tokenizer;
  /** What an example without tools of its own is shown under 'rl': the tool rollouts serve. */
  rolloutTools: readonly ToolSpec[];
  toolCallStyle?: ToolCallStyle;
}

export interface SftRenderer {
  /** The example as text, in the pieces the model reads and writes (`train`). */
  pieces(ex: ChatExample, template: SftTemplate): TextPiece[];
  /** Token ids and loss mask: each piece encoded on its own, as prompt and generated ids are in a rollout. */
  sequence(ex: ChatExample, template: SftTemplate): { ids: number[]; mask: number[] };
}

export function sftRenderer(o: SftRenderOptions): SftRenderer {
  const tok = o.tokenizer;
  const vars = tok?.templateVars() ?? {};
  // the agent loop stops a turn at <|im_end|>, which the RL templates end every turn with
  const stop = tok ? tok.tokenOf(tok.imEnd) : '<|im_end|>';
  const ends = tok ? tok.stopIds.map((id) => tok.tokenOf(id)) : ['<|im_end|>'];
  const whole = new Map<SftTemplate, ChatTemplate>();
  const wholeTemplate = (t: SftTemplate): ChatTemplate => {
    let c = whole.get(t);
    if (!c) {
      if (t === 'model' && !tok) throw new Error("SFT template 'model' needs the model's tokenizer");
      c = t === 'qwen' ? ChatTemplate.named('qwen') : ChatTemplate.fromTokenizer(tok as Tokenizer);
      whole.set(t, c);
    }
    return c;
  };
  const pieces = (ex: ChatExample, template: SftTemplate): TextPiece[] => {
    if (template !== 'rl')
      return wholeTemplate(template).turnPieces(ex.messages, { tools: ex.tools, vars, ends });
    const { prompt, segments } = chatSegments(ex, { toolCallStyle: o.toolCallStyle });
    const tools = ex.tools ?? o.rolloutTools;
    const out: TextPiece[] = [
      { text: o.rl.render(prompt, { tools, addGenerationPrompt: true, vars }), train: false },
    ];
    for (const s of segments)
      out.push(
        s.role === 'assistant'
          ? { text: s.text + stop, train: s.train }
          : { text: o.rl.toolTurnText(s.texts, vars), train: false },
      );
    return out;
  };
  return {
    pieces,
    sequence(ex, template) {
      if (!tok) throw new Error('token ids need a tokenizer');
      const ids: number[] = [];
      const mask: number[] = [];
      for (const p of pieces(ex, template)) {
        const part = tok.encode(p.text, { addSpecialTokens: false });
        ids.push(...part);
        mask.push(...part.map(() => (p.train ? 1 : 0)));
      }
      return { ids, mask };
    },
  };
}

/**
 * The text of an example for a tokenizer's training corpus: as 'rl' renders its turns where it can (so a
 * preset's BPE vocabulary is what it was before whole conversations were taken), else every message and call.
 */
export function sftTexts(ex: ChatExample, toolCallStyle?: ToolCallStyle): string[] {
  try {
    const r = chatSegments(ex, { toolCallStyle });
    return [
      ...r.prompt.map((m) => m.content),
      ...r.segments.flatMap((g) => (g.role === 'tool' ? g.texts : [g.text])),
    ];
  } catch {
    return ex.messages.flatMap((m) => [
      m.content,
      ...(m.tool_calls ?? []).map((c) => toolCallBlock(c.function.name, c.function.arguments, 'template')),
    ]);
  }
}

/** A tool that SFT examples call: how often, in how many examples, and whether it takes `code` as the rollout tool does. */
export interface ToolUse {
  name: string;
  calls: number;
  examples: number;
  takesCode: boolean;
}

/** Every tool the examples call, most called first. */
export function toolUse(examples: readonly ChatExample[]): ToolUse[] {
  const use = new Map<string, ToolUse>();
  for (const ex of examples) {
    const names = calledToolNames(ex);
    for (const name of names) {
      let u = use.get(name);
      if (!u) use.set(name, (u = { name, calls: 0, examples: 0, takesCode: false }));
      u.calls++;
    }
    for (const name of new Set(names)) {
      const u = use.get(name) as ToolUse;
      u.examples++;
      const schema = ex.tools?.find((t) => t.function.name === name);
      const props = (schema?.function.parameters as { properties?: object } | undefined)?.properties;
      const argCode = ex.messages.some((m) =>
        m.tool_calls?.some((c) => c.function.name === name && 'code' in c.function.arguments),
      );
      if ((props && 'code' in props) || argCode) u.takesCode = true;
    }
  }
  return [...use.values()].sort((a, b) => b.calls - a.calls || a.name.localeCompare(b.name));
}

/**
 * A warning when examples call tools that rollouts do not serve (they answer any other name with a tool error),
 * naming the most called and saying which look like the rollout tool under another name; null when none.
 */
export function unservedToolsWarning(use: readonly ToolUse[], served: string): string | null {
  // a code tool under another name first: the likely mistake, and the one a long list of other tools would hide
  const other = use
    .filter((u) => u.name !== served)
    .sort((a, b) => Number(b.takesCode && b.name !== '') - Number(a.takesCode && a.name !== ''));
  if (other.length === 0) return null;
  const say = (u: ToolUse) =>
    `${u.name === '' ? '(a call with no name)' : `'${u.name}'`} (${u.calls} call${u.calls === 1 ? '' : 's'} in ${u.examples} example${u.examples === 1 ? '' : 's'}` +
    `${u.takesCode && u.name !== '' ? `; it takes 'code' as the rollout tool does: tool.name: ${u.name} serves it under that name` : ''})`;
  const shown = other.slice(0, 5).map(say);
  if (other.length > 5) shown.push(`and ${other.length - 5} more`);
  return (
    `SFT data calls tools the RL stages do not serve: ${shown.join(', ')}. Rollouts serve only '${served}' ` +
    `(recipe tool.name) and answer any other name with a tool error`
  );
}
