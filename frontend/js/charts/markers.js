// Finding markers: a dotted vertical line on a step-axis chart at the step where a finding
// began, coloured by severity, with the finding's code as a small label (line charts) and its
// message on hover. A marker with a `last` step is a range instead (a distributed run's partial
// steps): a faint band from `step` to `last`. Names and messages go through plotlyText: shown as
// text, never parsed.

import { plotlyText } from "../format.js";
import { partialText } from "../ranks.js";

/**
 * @typedef {{step: number, code: string, severity: string, message: string, last?: number}} Marker
 */

/** Markers from findings: those with a first step, one per code. */
export function markersOf(findings) {
  return (findings || [])
    .filter((f) => Number.isFinite(Number(f.first_step)) && f.first_step !== null)
    .map((f) => ({ step: Number(f.first_step), code: String(f.code || ""), severity: String(f.severity || "info"),
      message: String(f.message || "") }))
    .sort((a, b) => a.step - b.step || a.code.localeCompare(b.code));
}

/** Bands for a distributed run's partial ranges (GET .../ranks `partial.ranges`), labelled "partial". */
export function partialMarkers(ranges) {
  return (ranges || []).map((r) => ({ step: r.first, last: r.last, code: "partial", severity: "warning",
    message: partialText(r) }));
}

/** Whether two lists of markers draw the same (the findings are fetched again every few seconds). */
export function sameMarkers(a, b) {
  return a.length === b.length && a.every((m, i) => m.step === b[i].step && m.code === b[i].code
    && m.severity === b[i].severity && m.message === b[i].message && m.last === b[i].last);
}

/** Plotly shapes (and, with labels, annotations) for `markers` in theme `t`. */
export function markerLayout(markers, t, { labels = true } = {}) {
  const color = (m) => t.severity[m.severity] || t.severity.info;
  const shapes = markers.map((m) => (m.last !== undefined ? {
    type: "rect", xref: "x", yref: "paper", x0: m.step - 0.5, x1: m.last + 0.5, y0: 0, y1: 1, layer: "below",
    line: { width: 0 }, fillcolor: color(m), opacity: 0.12,
  } : {
    type: "line", xref: "x", yref: "paper", x0: m.step, x1: m.step, y0: 0, y1: 1, layer: "above",
    line: { color: color(m), width: 1.5, dash: "dot" },
  }));
  const atStep = new Map();
  const annotations = labels ? markers.map((m) => {
    const k = atStep.get(m.step) || 0;
    atStep.set(m.step, k + 1);
    return {
      x: m.step, xref: "x", y: 0.93 - 0.09 * k, yref: "paper", xanchor: "left", yanchor: "top", xshift: 3,
      text: plotlyText(m.code), hovertext: m.last !== undefined ? plotlyText(m.message) : `step ${m.step}: ${plotlyText(m.message)}`,
      showarrow: false, font: { size: 10, color: color(m) }, bgcolor: t.card, opacity: 0.9,
      captureevents: false,
    };
  }) : [];
  return { shapes, annotations };
}

/** Publish the drawn markers on the chart element (for tests and people): data-markers="12,40". */
export function markMarkers(el, markers) {
  if (markers.length) el.dataset.markers = markers.map((m) => m.step).join(",");
  else delete el.dataset.markers;
}
