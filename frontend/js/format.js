// Values and how they are shown. The one place that turns wire values into numbers.
//
// The REST API and the live websocket encode a non-finite float as one of the strings
// "NaN", "Infinity", "-Infinity", and a value that does not apply (ABSENT) as null.
// toNumber() maps them to JS NaN / ±Infinity / null; every chart and table goes through it.

const NONFINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

/** A wire value as a number: a finite number, NaN, ±Infinity, or null for ABSENT. */
export function toNumber(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === "number") return v;
  if (typeof v === "string" && v in NONFINITE) return NONFINITE[v];
  const n = Number(v);
  return Number.isNaN(n) ? null : n;
}

/** An array of wire values as numbers (see toNumber). */
export function toNumbers(arr) {
  return Array.isArray(arr) ? arr.map(toNumber) : [];
}

/** True for NaN, +Infinity and -Infinity (never for null/ABSENT). */
export function isNonFinite(x) {
  return typeof x === "number" && !Number.isFinite(x);
}

/** How a non-finite value is named in charts and tables. */
export function nonFiniteLabel(x) {
  if (Number.isNaN(x)) return "NaN";
  return x > 0 ? "+Inf" : "-Inf";
}

/** The four gradient buffer states, indexed by their wire code (protocol.md). */
export const GRAD_STATUS = ["none", "zero", "nonzero", "nonfinite"];

/** A grad_status cell (code or word, null when absent) as its code 0..3, or null. */
export function statusCode(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === "number") return v >= 0 && v <= 3 ? v : null;
  const i = GRAD_STATUS.indexOf(String(v));
  return i < 0 ? null : i;
}

/** `x` to 4 significant digits as Plotly's hover writes it (d3's ".4~g"): "0.1235", "1.5e-7". */
export function fmtSignificant(x, digits = 4) {
  const [mantissa, exponent] = x.toPrecision(digits).split("e");
  const m = mantissa.includes(".") ? mantissa.replace(/\.?0+$/, "") : mantissa;
  return (exponent ? `${m}e${exponent}` : m).replace(/^-/, "\u2212");
}

/** A number for people: 4 significant digits, NaN/±Inf named, ABSENT as an em dash. */
export function fmtNum(x, digits = 4) {
  if (x === null || x === undefined) return "—";
  if (isNonFinite(x)) return nonFiniteLabel(x);
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e6 || a < 1e-3) return x.toExponential(digits - 1).replace("e+", "e");
  return String(Number(x.toPrecision(digits)));
}

/**
 * A count with thousands grouped by commas, or compact (1.2M) when `compact`. Grouped by hand:
 * the first toLocaleString() loads the browser's locale data, ~100 ms before the run page's
 * first chart on a slow machine.
 */
export function fmtCount(n, compact = false) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  if (!compact || Math.abs(n) < 10000) return String(Math.round(n)).replace(/\B(?=(\d{3})+$)/g, ",");
  const units = [["B", 1e9], ["M", 1e6], ["k", 1e3]];
  for (const [u, s] of units) if (Math.abs(n) >= s) return `${Number((n / s).toPrecision(3))}${u}`;
  return String(n);
}

export const BYTE_UNITS = [["B", 1], ["KiB", 2 ** 10], ["MiB", 2 ** 20], ["GiB", 2 ** 30], ["TiB", 2 ** 40]];

/** The largest binary unit that keeps `bytes` at or above 1 (e.g. ["MiB", 1048576]). */
export function byteUnit(bytes) {
  let unit = BYTE_UNITS[0];
  for (const u of BYTE_UNITS) if (Math.abs(bytes) >= u[1]) unit = u;
  return unit;
}

/** Bytes for people: "12.3 MiB". */
export function fmtBytes(bytes) {
  const b = typeof bytes === "number" ? bytes : toNumber(bytes);
  if (b === null || isNonFinite(b)) return fmtNum(b);
  const [name, size] = byteUnit(b);
  return `${size === 1 ? b : Number((b / size).toPrecision(3))} ${name}`;
}

/** A duration in seconds for people: "42s", "3m 05s", "2h 04m", "3d 2h". */
export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds) || seconds < 0) return "—";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

/** Unix seconds as a local date and time, "2024-11-22 14:03". */
export function fmtTime(unixSeconds) {
  if (!unixSeconds) return "—";
  const d = new Date(unixSeconds * 1000);
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}`;
}

/** Unix seconds relative to now: "just now", "5 min ago", "3 h ago", or the date. */
export function fmtAgo(unixSeconds, now = Date.now() / 1000) {
  if (!unixSeconds) return "—";
  const d = now - unixSeconds;
  if (d < 45) return "just now";
  if (d < 3600) return `${Math.round(d / 60)} min ago`;
  if (d < 86400) return `${Math.round(d / 3600)} h ago`;
  return fmtTime(unixSeconds);
}

/** A run's duration: from creation to its end, or to its last update while running. */
export function runDuration(run, now = Date.now() / 1000) {
  const start = run.created_at;
  if (!start) return null;
  const end = run.finished_at || (run.status === "running" ? now : run.updated_at) || now;
  return Math.max(0, end - start);
}

/**
 * A string for Plotly text (trace names, tick labels, hover text).
 * Plotly reads a small HTML subset in text; escaping &, < and > makes it show the
 * string literally, so a parameter named "<b>x</b>" is drawn as those characters.
 */
export function plotlyText(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}
