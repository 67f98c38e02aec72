import { viewTrajectory } from '../dashboard/index.js';
import { lastBoxed } from '../eval/index.js';
import type { Trajectory } from '../rl/index.js';
import { visible } from '../util/terminal.js';

// Terminal rendering of one agent answer: thinking, code, tool output and the final answer each get
// a labelled rule and their own colour, so they never run together. Without colour (pipes, NO_COLOR)
// the labels alone keep them apart. Everything the model or its tool wrote passes through visible() first:
// an escape sequence in it is shown, never obeyed (util/terminal.ts).

export interface RenderOptions {
  color: boolean;
  width?: number;
}

const ANSI = {
  dim: '\x1b[2m',
  bold: '\x1b[1m',
  cyan: '\x1b[36m',
  yellow: '\x1b[33m',
  red: '\x1b[31m',
  green: '\x1b[32m',
  magenta: '\x1b[35m',
  reset: '\x1b[0m',
};
type Tone = keyof typeof ANSI;

export function colorWanted(stream: NodeJS.WriteStream, flag?: boolean): boolean {
  if (flag === false || process.env.NO_COLOR) return false;
  return Boolean(stream.isTTY) || process.env.FORCE_COLOR !== undefined;
}

export function renderAnswer(t: Trajectory, o: RenderOptions): string {
  const width = Math.max(20, Math.min(o.width ?? 80, 100));
  const paint = (tone: Tone, s: string) => (o.color ? `${ANSI[tone]}${s}${ANSI.reset}` : s);
  const rule = (label: string, tone: Tone) =>
    paint(tone, `── ${label} ${'─'.repeat(Math.max(2, width - label.length - 4))}`);
  const body = (s: string, tone?: Tone) => {
    const text = visible(s).replace(/\s+$/, '');
    return tone
      ? text
          .split('\n')
          .map((l) => paint(tone, l))
          .join('\n')
      : text;
  };
  const v = viewTrajectory(t);
  const out: string[] = [];
  for (const turn of v.turns) {
    if (turn.reasoning) out.push(rule('thinking', 'dim'), body(turn.reasoning, 'dim'));
    for (const c of turn.toolCalls) {
      const label = c.parseError ? `python (unparsed call: ${visible(c.parseError)})` : 'python';
      out.push(rule(label, 'cyan'), body(c.code));
    }
    for (const r of turn.toolResults) {
      const tone: Tone = r.error ? 'red' : 'yellow';
      out.push(
        rule(`tool output · ${visible(r.status ?? (r.error ? 'error' : 'ok'))} · ${r.ms} ms`, tone),
        body(r.text, tone),
      );
    }
  }
  const boxed = lastBoxed(t.text);
  out.push(rule('answer', 'green'));
  if (v.answer) out.push(body(v.answer));
  out.push(paint('bold', boxed !== null ? `⇒ ${visible(boxed)}` : '⇒ (no \\boxed{} answer)'));
  if (t.finish !== 'answered') {
    out.push(paint('magenta', `[stopped: ${t.finish}${t.error ? ` — ${visible(t.error)}` : ''}]`));
  }
  out.push(
    paint(
      'dim',
      `${t.responseMask.reduce((a, m) => a + m, 0)} generated tokens · ${t.numToolCalls} tool calls` +
        ` (${t.numToolErrors} errors) · ${(t.ms / 1000).toFixed(1)} s`,
    ),
  );
  return `${out.join('\n')}\n`;
}
