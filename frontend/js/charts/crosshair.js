// A shared crosshair: the step under the mouse on one chart is marked, as a thin vertical line,
// on every chart of the page with the same kind of x axis (steps, or compare's wall time). The
// lines are HTML over each plot, placed from Plotly's axis (no relayout: moving the mouse costs
// no redraw). Each chart publishes the step it marks as data-crosshair (for tests and people).

const charts = new Map(); // plot element -> {kind, line}
let shown = null;         // {kind, x} marked now

/** The plot area of a drawn Plotly chart, in pixels of its element, with its x axis. */
function area(el) {
  const fl = el._fullLayout;
  const xa = fl && fl.xaxis;
  const ya = fl && fl.yaxis;
  if (!xa || !ya || typeof xa.p2l !== "function") return null;
  return { xa, left: xa._offset, width: xa._length, top: ya._offset, height: ya._length };
}

function place(el, entry, x) {
  const a = area(el);
  const px = a ? a.xa.l2p(x) : NaN;
  if (!a || !Number.isFinite(px) || px < 0 || px > a.width || el.dataset.empty !== undefined) {
    entry.line.hidden = true;
    delete el.dataset.crosshair;
    return;
  }
  Object.assign(entry.line.style, { left: `${a.left + px}px`, top: `${a.top}px`, height: `${a.height}px` });
  entry.line.hidden = false;
  el.dataset.crosshair = String(x);
}

/** Mark `x` on every chart of `kind` (null: clear every line). */
export function showCrosshair(kind, x) {
  shown = x === null ? null : { kind, x };
  for (const [el, entry] of charts) {
    if (!el.isConnected) { charts.delete(el); continue; }
    if (shown && entry.kind === kind) place(el, entry, x);
    else {
      entry.line.hidden = true;
      delete el.dataset.crosshair;
    }
  }
}

/**
 * Follow the mouse over the plot element `el` (a drawn Plotly chart) and show the crosshair
 * of `kind` there; `round` turns an axis value into the x to mark (steps: whole numbers).
 */
export function attachCrosshair(el, kind = "step", round = Math.round) {
  if (charts.has(el)) return;
  const line = document.createElement("div");
  line.className = "crosshair";
  line.hidden = true;
  line.setAttribute("aria-hidden", "true");
  el.appendChild(line);
  charts.set(el, { kind, line });
  el.addEventListener("mousemove", (ev) => {
    const a = area(el);
    if (!a) return;
    const box = el.getBoundingClientRect();
    const px = ev.clientX - box.left - a.left;
    const py = ev.clientY - box.top - a.top;
    if (px < 0 || px > a.width || py < 0 || py > a.height) return showCrosshair(kind, null);
    const x = round(a.xa.p2l(px));
    if (!shown || shown.x !== x || shown.kind !== kind) showCrosshair(kind, x);
  });
  el.addEventListener("mouseleave", () => showCrosshair(kind, null));
  if (shown && shown.kind === kind) place(el, charts.get(el), shown.x);
}
