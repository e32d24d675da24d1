// A heatmap's hover. The chart shows its cells as an image (raster.js), which Plotly cannot
// hover, so the cell under the pointer is found here and Plotly draws the label for it
// (Fx.loneHover), in the same place and style as for a heatmap trace.

import { plotly } from "./theme.js";

/**
 * Label the cell under the pointer in the Plotly chart `el`. `cellAt(x, row)` (x in data
 * units, the row's index) gives {x0, x1, text, name} for the cell (its edges in data units,
 * the label's lines joined by <br>, escaped for Plotly; the name in the label's side box), or
 * null for no label; `style()` the label's {color, borderColor, fontColor, fontFamily}.
 */
export function cellHover(el, cellAt, style) {
  let shown = false;
  const hide = () => {
    if (shown && el._fullLayout) plotly().Fx.loneUnhover(el._fullLayout._hoverlayer.node());
    shown = false;
  };
  el.addEventListener("mousemove", (event) => {
    const fl = el._fullLayout;
    if (!fl || !fl.xaxis || el._dragging) return hide();
    const box = el.getBoundingClientRect();
    const { l, t, w, h } = fl._size;
    const px = event.clientX - box.left - l;
    const py = event.clientY - box.top - t;
    if (px < 0 || py < 0 || px > w || py > h) return hide();
    const row = Math.round(fl.yaxis.p2l(py));
    const cell = cellAt(fl.xaxis.p2l(px), row);
    if (!cell) return hide();
    const [x0, x1] = [fl.xaxis.l2p(cell.x0), fl.xaxis.l2p(cell.x1)].map((p) => l + Math.min(w, Math.max(0, p)));
    const [y0, y1] = [fl.yaxis.l2p(row - 0.5), fl.yaxis.l2p(row + 0.5)].map((p) => t + p);
    plotly().Fx.loneHover({ x0, x1, y0: Math.min(y0, y1), y1: Math.max(y0, y1), text: cell.text, name: cell.name, ...style() },
      { container: fl._hoverlayer.node(), outerContainer: fl._paper.node(), gd: el });
    shown = true;
  });
  el.addEventListener("mouseleave", hide);
}
