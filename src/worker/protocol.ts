// Wire format between the TS client and python/rstar2_worker (both directions, over stdio):
//   u32 LE frame length (bytes after this field) | u32 LE header length | header JSON (utf8) | payload
// The header lists the payload's arrays in order: {name, dtype: 'i32' | 'f32', length}. Token ids and
// per-token floats travel as raw little-endian arrays, never as JSON lists.
export const PROTOCOL_VERSION = 4;

export type WireArray = Int32Array | Float32Array;
export interface ArraySpec {
  name: string;
  dtype: 'i32' | 'f32';
  length: number;
}
export interface Frame {
  header: Record<string, unknown> & { arrays?: ArraySpec[] };
  arrays: Record<string, WireArray>;
}

export function encodeFrame(header: Record<string, unknown>, arrays: Record<string, WireArray> = {}): Buffer {
  const specs: ArraySpec[] = [];
  const parts: Buffer[] = [];
  for (const [name, a] of Object.entries(arrays)) {
    specs.push({ name, dtype: a instanceof Int32Array ? 'i32' : 'f32', length: a.length });
    parts.push(Buffer.from(a.buffer, a.byteOffset, a.byteLength));
  }
  const head = Buffer.from(JSON.stringify({ ...header, arrays: specs }), 'utf8');
  const prefix = Buffer.alloc(8);
  const payloadLen = parts.reduce((n, p) => n + p.length, 0);
  prefix.writeUInt32LE(4 + head.length + payloadLen, 0);
  prefix.writeUInt32LE(head.length, 4);
  return Buffer.concat([prefix, head, ...parts]);
}

/** Incremental decoder: feed stdout chunks, get whole frames back. */
export class FrameReader {
  private buf: Buffer = Buffer.alloc(0);

  push(chunk: Buffer): Frame[] {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    const out: Frame[] = [];
    while (this.buf.length >= 4) {
      const len = this.buf.readUInt32LE(0);
      // a frame's JSON header follows its two lengths: anything else is stray output on the stream, which read
      // as a length would otherwise leave the reader waiting for gigabytes that never come
      if (this.buf.length >= 9 && (this.buf[8] !== 0x7b || this.buf.readUInt32LE(4) > len)) {
        const text = JSON.stringify(this.buf.subarray(0, 40).toString('latin1'));
        throw new Error(`worker protocol: stray bytes on the frame stream, not a frame: ${text}`);
      }
      if (this.buf.length < 4 + len) break;
      out.push(decodeBody(this.buf.subarray(4, 4 + len)));
      this.buf = this.buf.subarray(4 + len);
    }
    return out;
  }
}

function decodeBody(body: Buffer): Frame {
  const headLen = body.readUInt32LE(0);
  let header: Frame['header'];
  try {
    header = JSON.parse(body.subarray(4, 4 + headLen).toString('utf8'));
  } catch (e) {
    throw new Error(`worker protocol: unreadable frame header (${(e as Error).message})`);
  }
  const arrays: Record<string, WireArray> = {};
  let off = 4 + headLen;
  for (const spec of header.arrays ?? []) {
    const bytes = spec.length * 4;
    // copy so the typed array is aligned and does not pin the read buffer
    const copy = new Uint8Array(body.subarray(off, off + bytes)).buffer;
    arrays[spec.name] = spec.dtype === 'i32' ? new Int32Array(copy) : new Float32Array(copy);
    off += bytes;
  }
  return { header, arrays };
}

/** Ragged list of int sequences → flat values + lengths. */
export function packRagged(seqs: number[][], what: string): { flat: Int32Array; lens: Int32Array } {
  const lens = new Int32Array(seqs.length);
  let total = 0;
  seqs.forEach((s, i) => {
    if (!Array.isArray(s)) throw new Error(`${what}[${i}] is not an array of token ids`);
    lens[i] = s.length;
    total += s.length;
  });
  const flat = new Int32Array(total);
  let off = 0;
  seqs.forEach((s, i) => {
    for (let j = 0; j < s.length; j++) {
      const v = s[j];
      if (!Number.isInteger(v) || v < -2147483648 || v > 2147483647) {
        throw new Error(`${what}[${i}][${j}] = ${v} is not a 32-bit integer`);
      }
      flat[off++] = v;
    }
  });
  return { flat, lens };
}

export function unpackRagged<T extends WireArray>(flat: T, lens: Int32Array): number[][] {
  const out: number[][] = [];
  let off = 0;
  for (const n of lens) {
    out.push(Array.from(flat.subarray(off, off + n)));
    off += n;
  }
  return out;
}
