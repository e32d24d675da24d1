// Heatmap cells as float32, the way the server sends them (heatmap?encoding=f32, docs/api.md):
// no JSON numbers to parse, a quarter of the bytes. The heatmaps keep a column (Float32Array,
// one cell per row) per step bucket. Two NaNs are told apart by their bits: EMPTY (the cell
// has no value: ABSENT, or no step; JSON's null) and a measured NaN. A float read from a
// Float32Array is NaN for both, and writing a NaN may change its bits, so cells are copied and
// classed through Uint32Array views of the same bytes, never through JS numbers.

import { statusCode, toNumber } from "./format.js";

export const EMPTY_BITS = 0x7fc00001;

/** The bytes of standard (padded) base64 `text`. */
function fromBase64(text) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text);
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** The Uint32Array over the same bytes as `cells` (a Float32Array). */
export function bitsOf(cells) {
  return new Uint32Array(cells.buffer, cells.byteOffset, cells.length);
}

/** Write a wire value (number, "NaN"/"Infinity"/"-Infinity", a status word, or null) to cell k. */
function setCell(cells, bits, k, v, isStatus) {
  const n = isStatus ? statusCode(v) : toNumber(v);
  if (n === null) bits[k] = EMPTY_BITS;
  else cells[k] = n;
}

/**
 * A heatmap answer's cells, row-major (params x steps; cell (i, j) at i * steps + j): decoded
 * from `z_f32`, or converted from `z` when the server answered in JSON (one that predates f32).
 */
export function gridCells(res, isStatus) {
  const rows = (res.params || []).length;
  const cols = (res.step || []).length;
  if (typeof res.z_f32 === "string") {
    // Little-endian, as the wire says: the byte order of every machine a browser runs on.
    const bytes = fromBase64(res.z_f32);
    if (bytes.length !== rows * cols * 4) throw new Error(`heatmap: ${bytes.length} bytes for ${rows} x ${cols} cells`);
    return new Float32Array(bytes.buffer, bytes.byteOffset, rows * cols);
  }
  const cells = new Float32Array(rows * cols);
  const bits = bitsOf(cells);
  bits.fill(EMPTY_BITS);
  (res.z || []).forEach((row, i) => row.forEach((v, j) => setCell(cells, bits, i * cols + j, v, isStatus)));
  return cells;
}

/**
 * Row-major `cells` with `cols` columns as columns, rows taken in `order` (indices into its
 * rows): Float32Array views of one buffer (one allocation, not one per column).
 */
export function gridColumns(cells, cols, order) {
  const src = bitsOf(cells);
  const n = order.length;
  const all = new Float32Array(cols * n);
  const dst = bitsOf(all);
  for (let r = 0; r < n; r++) {
    const from = order[r] * cols;
    for (let j = 0; j < cols; j++) dst[j * n + r] = src[from + j];
  }
  const out = new Array(cols);
  for (let j = 0; j < cols; j++) out[j] = all.subarray(j * n, (j + 1) * n);
  return out;
}

/** A live step's values (wire values, in /params order) as a column: row r is values[rowIndex[r]]. */
export function liveColumn(values, rowIndex, isStatus) {
  const col = new Float32Array(rowIndex.length);
  const bits = bitsOf(col);
  rowIndex.forEach((i, r) => setCell(col, bits, r, i === undefined ? null : values[i], isStatus));
  return col;
}

/**
 * Two columns as one, by the server's bucket rule: the highest status code; else the largest
 * magnitude, a non-finite value winning over any finite one. An EMPTY cell takes the other's.
 */
export function mergeColumns(a, b, isStatus) {
  const out = new Float32Array(a.length);
  const ab = bitsOf(a);
  const bb = bitsOf(b);
  const ob = bitsOf(out);
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    const y = b[i];
    let takeB;
    if (ab[i] === EMPTY_BITS || bb[i] === EMPTY_BITS) takeB = ab[i] === EMPTY_BITS;
    else if (isStatus) takeB = y > x;
    else if (!Number.isFinite(x)) takeB = false;
    else takeB = !Number.isFinite(y) || Math.abs(y) > Math.abs(x);
    ob[i] = takeB ? bb[i] : ab[i];
  }
  return out;
}
