// Model and tool text in a terminal: control sequences are shown, never obeyed (issue 42, break 7).
// The sequences are the ones terminals act on, as xterm's ctlseqs documents them (invisible-island.net/xterm/
// ctlseqs/ctlseqs.html): OSC 52 sets the clipboard, OSC 0/2 the title, OSC 8 a hyperlink, CSI moves the cursor
// and erases; ECMA-48 (5th ed., 1991) sect. 5.3 gives their 7-bit (ESC Fe) and 8-bit (C1, 0x80-0x9F) openers.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { renderAnswer } from '../../src/chat/render.js';
import { fakeTrajectory } from '../../src/eval/fake.js';
import { forTerminal, visible } from '../../src/util/terminal.js';

const ESC = '\x1b';
const BEL = '\x07';
const ST = `${ESC}\\`;
const ATTACKS = {
  clipboard: `${ESC}]52;c;ZWNobyBwd25lZA==${BEL}`, // OSC 52: write "echo pwned" to the clipboard
  title: `${ESC}]0;owned${BEL}${ESC}]2;also${ST}`, // OSC 0 / OSC 2, ended by BEL and by ST
  link: `${ESC}]8;;http://evil.example/${ST}click${ESC}]8;;${ST}`, // OSC 8 hyperlink
  cursor: `${ESC}[2A${ESC}[2K${ESC}[H${ESC}[2J${ESC}7${ESC}8`, // CUU, EL, CUP, ED, DECSC/DECRC
  c1: '\u009b2J\u009d52;c;cHduZWQ=\u009c\u0090q\u009c', // CSI, OSC ... ST, DCS as C1 controls
  overwrite: '41\r42\b\b43', // a bare CR and backspaces print over what was shown
  bidi: 'x\u202ey\u2066z\u2069', // RLO and LRI/PDI reorder what is displayed
};
// every C0 control but TAB and LF, DEL, every C1 control: none may reach the terminal raw
const RAW_CONTROL = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/;

test('visible() writes every terminal control as an escape and keeps tabs, newlines and UTF-8', () => {
  for (const [name, s] of Object.entries(ATTACKS)) {
    const v = visible(s);
    assert.doesNotMatch(v, RAW_CONTROL, name);
  }
  assert.equal(visible(ATTACKS.clipboard), '\\x1b]52;c;ZWNobyBwd25lZA==\\x07');
  assert.equal(visible(ATTACKS.c1), '\\x9b2J\\x9d52;c;cHduZWQ=\\x9c\\x90q\\x9c');
  assert.equal(visible(ATTACKS.overwrite), '41\\x0d42\\x08\\x0843');
  assert.equal(visible(ATTACKS.bidi), 'x\\u202ey\\u2066z\\u2069');
  const honest = 'col1\tcol2\nπ ≈ 3.14159, 中文, café 🙂\n';
  assert.equal(visible(honest), honest);
  assert.equal(visible('a\r\nb\r\n'), 'a\nb\n', 'Windows line ends are line ends');
  assert.equal(visible('\x00\x1f\x7f\x80\x9f\xa0'), '\\x00\\x1f\\x7f\\x80\\x9f\xa0', 'NBSP (0xA0) is text');
  assert.equal(forTerminal(ATTACKS.clipboard, { isTTY: true }), visible(ATTACKS.clipboard));
  assert.equal(forTerminal(ATTACKS.clipboard, { isTTY: false }), ATTACKS.clipboard, 'pipes get the bytes');
});

/** The fake trajectory with hostile text in each part renderAnswer shows: thinking, code, tool output, answer. */
function hostileTrajectory() {
  const t = fakeTrajectory({ problemId: 'p', answer: '42', sample: 0, seed: 1 }, 1);
  const all = Object.values(ATTACKS).join(' ');
  const asJson = JSON.stringify(all).slice(1, -1);
  const swap = (s: string) =>
    s
      .replace('Let me check the arithmetic with the tool.', `think ${all}`)
      .replace('print(6 * 7)', `print(6 * 7) # ${asJson}`)
      .replace('stdout: 42', `stdout: 42 ${all}`)
      .replace('\\boxed{42}', `\\boxed{42${ATTACKS.title}}`);
  return {
    ...t,
    text: swap(t.text),
    finish: 'error' as const,
    error: `engine said ${ATTACKS.cursor}`,
    events: t.events.map((e) =>
      e.kind === 'tool_result'
        ? { ...e, text: swap(e.text) }
        : e.kind === 'tool_call'
          ? { ...e, arguments: swap(e.arguments) }
          : e,
    ),
  };
}

test('renderAnswer shows the escapes in model text and tool output, and obeys none', () => {
  const t = hostileTrajectory();
  const plain = renderAnswer(t, { color: false, width: 60 });
  assert.doesNotMatch(plain, RAW_CONTROL);
  // each part still shows, with its escapes written out
  assert.match(plain, /── thinking ─+\nthink \\x1b\]52;c;ZWNobyBwd25lZA==\\x07/);
  assert.match(plain, /── python ─+\nprint\(6 \* 7\) # \\x1b\]52;c;/);
  assert.match(plain, /── tool output · ok[^\n]*\nTool call success\nstdout: 42 \\x1b\]52;c;/);
  assert.match(plain, /⇒ 42\\x1b\]0;owned\\x07/);
  assert.match(plain, /\[stopped: error — engine said \\x1b\[2A/);
  // with colour, the only escapes are the renderer's own SGR colour codes
  const colored = renderAnswer(t, { color: true, width: 60 });
  const withoutSgr = colored.replace(/\x1b\[[0-9;]*m/g, '');
  assert.doesNotMatch(withoutSgr, RAW_CONTROL);
  assert.ok(withoutSgr.includes('\\x9b2J'), 'a C1 CSI is shown');
});
