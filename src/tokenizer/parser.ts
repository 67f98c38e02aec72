// Hermes tool-call parsing with rStar2's semantics (rstar2_agent/tools/tool_parser.py): a turn
// has calls only if it contains both <tool_call> and </tool_call>; each block is JSON with `name`
// and `arguments`; a block that fails to parse is not dropped but becomes a call whose tool
// response is "Failed to decode tool call: …" (and counts towards the per-turn call limit).

export interface ParsedToolCall {
  name: string;
  arguments: string; // re-serialised JSON
  parseError?: string; // set: the tool response is `Failed to decode tool call: ${parseError}`
}

const BLOCK = /<tool_call>([\s\S]*?)<\/tool_call>/g;

export function parseToolCalls(text: string): ParsedToolCall[] {
  if (!text.includes('<tool_call>') || !text.includes('</tool_call>')) return [];
  const calls: ParsedToolCall[] = [];
  for (const m of text.matchAll(BLOCK)) {
    try {
      const obj = JSON.parse(m[1]) as unknown;
      if (typeof obj !== 'object' || obj === null || Array.isArray(obj)) {
        throw new Error(`tool call must be a JSON object, got ${Array.isArray(obj) ? 'array' : typeof obj}`);
      }
      const o = obj as Record<string, unknown>;
      // Python's KeyError text, as the reference shows it to the model
      if (!('name' in o)) throw new Error("'name'");
      if (!('arguments' in o)) throw new Error("'arguments'");
      calls.push({ name: String(o.name), arguments: JSON.stringify(o.arguments) });
    } catch (e) {
      calls.push({ name: '', arguments: '', parseError: (e as Error).message });
    }
  }
  return calls;
}

export function decodeFailureText(parseError: string): string {
  return `Failed to decode tool call: ${parseError}`;
}
