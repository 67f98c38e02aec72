// A one-line progress bar on stderr. Redraws in place on a terminal; on a pipe or in CI it prints a
// plain line at most every few seconds so logs stay readable.
export class Progress {
  private done = 0;
  private readonly start = Date.now();
  private lastDraw = 0;
  private readonly tty = Boolean(process.stderr.isTTY);
  private extra = '';

  constructor(
    private readonly label: string,
    private readonly total: number,
    private readonly enabled = !process.env.RSTAR2_NO_PROGRESS,
  ) {}

  tick(n = 1, extra?: string): void {
    this.done += n;
    if (extra !== undefined) this.extra = extra;
    this.draw(false);
  }

  set(done: number, extra?: string): void {
    this.done = done;
    if (extra !== undefined) this.extra = extra;
    this.draw(false);
  }

  finish(extra?: string): void {
    if (extra !== undefined) this.extra = extra;
    this.draw(true);
    if (this.enabled && this.tty) process.stderr.write('\n');
  }

  private draw(force: boolean): void {
    if (!this.enabled) return;
    const now = Date.now();
    const every = this.tty ? 100 : 5000;
    if (!force && now - this.lastDraw < every && this.done < this.total) return;
    this.lastDraw = now;
    const frac = this.total > 0 ? Math.min(1, this.done / this.total) : 0;
    const width = 24;
    const bar = '#'.repeat(Math.round(frac * width)).padEnd(width, '.');
    const secs = (now - this.start) / 1000;
    const eta = frac > 0 && frac < 1 ? ` eta ${fmtSecs((secs / frac) * (1 - frac))}` : '';
    const line = `${this.label} [${bar}] ${this.done}/${this.total} ${fmtSecs(secs)}${eta}${this.extra ? ` ${this.extra}` : ''}`;
    process.stderr.write(this.tty ? `\r\x1b[2K${line}` : `${line}\n`);
  }
}

function fmtSecs(s: number): string {
  if (s < 60) return `${s.toFixed(0)}s`;
  const m = Math.floor(s / 60);
  return m < 60
    ? `${m}m${String(Math.round(s % 60)).padStart(2, '0')}s`
    : `${Math.floor(m / 60)}h${String(m % 60).padStart(2, '0')}m`;
}
