// Text a model wrote (or a snippet printed) is hostile when it reaches a terminal: an escape sequence in it is
// obeyed, not shown. OSC 52 writes the user's clipboard, OSC 0/2 the window title, OSC 8 hides a link behind
// other text, CSI cursor moves and a bare CR overwrite what was printed before. ECMA-48 has every such
// sequence start with a C0 control (ESC, or CR/BS for the cursor), or with a C1 control (U+0080-U+009F, which
// xterm also reads in UTF-8), so showing those controls as escapes, and only those, leaves any sequence inert.
// Newlines, tabs and all printable UTF-8 pass unchanged. The explicit bidirectional overrides and isolates
// (U+202A-U+202E, U+2066-U+2069) are shown too: they let text display in an order other than its own.

// C0 except TAB and LF, DEL, C1, and the bidi embedding/override/isolate controls
const CONTROL = /\r\n|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/g;

function written(c: string): string {
  if (c === '\r\n') return '\n';
  const n = c.charCodeAt(0);
  return n <= 0xff ? `\\x${n.toString(16).padStart(2, '0')}` : `\\u${n.toString(16).padStart(4, '0')}`;
}

/** `s` with every control character that could steer a terminal written as an escape (ESC as `\x1b`, C1 CSI as
 * `\x9b`, a lone CR as `\x0d`; CRLF becomes LF). Tabs, newlines and printable text are kept. */
export function visible(s: string): string {
  return s.replace(CONTROL, written);
}

/** `visible(s)` where the stream is a terminal, `s` itself where it is a pipe or a file (kept byte for byte). */
export function forTerminal(s: string, stream: { isTTY?: boolean }): string {
  return stream.isTTY ? visible(s) : s;
}
