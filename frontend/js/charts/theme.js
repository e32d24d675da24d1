// Chart colours and the common Plotly layout, read from the CSS custom properties of
// css/app.css so that charts follow the light/dark theme (prefers-color-scheme).

const charts = new Set();

/** The Plotly global, loaded by a classic <script> (deferred, or async on the run page). */
export function plotly() {
  if (!window.Plotly) throw new Error("Plotly did not load (/static/vendor/plotly.min.js)");
  return window.Plotly;
}

const PLOTLY_SRC = "/static/vendor/plotly.min.js";
let plotlyLoad = null;

/**
 * Resolves once Plotly is there; charts wait here to draw. A page without a <script> for it
 * gets one now: the run page only preloads Plotly and calls this once its data requests are
 * out, so that the server works while the browser compiles Plotly. The performance mark
 * `gradwatch:plotly` says when it was ready (benchmarks/dashboard.py reports it).
 */
export function whenPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!plotlyLoad) {
    let script = document.querySelector('script[src$="/plotly.min.js"]');
    if (!script) script = document.head.appendChild(Object.assign(document.createElement("script"), { src: PLOTLY_SRC }));
    plotlyLoad = new Promise((resolve, reject) => {
      script.addEventListener("load", () => {
        performance.mark("gradwatch:plotly");
        resolve(window.Plotly);
      });
      script.addEventListener("error", () => reject(new Error(`Plotly did not load (${PLOTLY_SRC})`)));
    });
  }
  return plotlyLoad;
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

let current = null; // the theme's colours, read once per colour scheme

/**
 * The current theme's colours. Read from the CSS once and kept until the colour scheme
 * changes: each read of ~25 custom properties can force a style recalculation, and every chart
 * asks on every draw.
 */
export function theme() {
  current ||= readTheme();
  return current;
}

function readTheme() {
  const palette = [];
  for (let i = 1; i <= 10; i++) palette.push(cssVar(`--series-${i}`) || "#888");
  return {
    fg: cssVar("--fg"),
    muted: cssVar("--fg-muted"),
    grid: cssVar("--chart-grid"),
    axis: cssVar("--border"),
    card: cssVar("--bg-card"),
    border: cssVar("--border"),
    nonfinite: cssVar("--nonfinite"),
    zero: cssVar("--zero"),
    font: cssVar("--font-sans"),
    mono: cssVar("--font-mono"),
    status: ["--status-none", "--status-zero", "--status-nonzero", "--status-nonfinite"].map(cssVar),
    severity: { error: cssVar("--bad"), warning: cssVar("--warn"), info: cssVar("--info") },
    palette,
  };
}

/** The i-th series colour. */
export function seriesColor(i, t = theme()) {
  return t.palette[i % t.palette.length];
}

/**
 * Margins that already hold what Plotly's automargin makes room for at these font sizes: the
 * x axis's labels and title (b), y labels up to about 51 px (l), half a label past either end
 * of an axis (t, r), each plus the 12 px of padding automargin adds (the smallest margin, up to
 * 12: so none is below 12). When a label needs more, automargin grows the margin, which costs a
 * second full draw of the chart; a margin at least as large as needed costs nothing
 * (tests/browser/test_run_page_loading.py checks that none grows).
 */
export const MARGIN = { l: 72, r: 20, t: 19, b: 47 };

/** What automargin adds to a y axis's widest label: the tick, its gap, the padding. */
export const Y_LABEL_PAD = 21;

let measurer = null;

/** The width in pixels of `text` drawn in `font` (a CSS font, e.g. "11px monospace"). */
export function textWidth(text, font) {
  measurer ||= document.createElement("canvas").getContext("2d");
  measurer.font = font;
  return measurer.measureText(text).width;
}

function axis(t, extra = {}) {
  return {
    gridcolor: t.grid,
    zerolinecolor: t.grid,
    linecolor: t.axis,
    tickcolor: t.axis,
    automargin: true,
    // The margins make room for the labels: Plotly need not measure every label after each
    // draw to hide those past the chart's edge (a fifth of a live redraw's cost).
    ticklabeloverflow: "allow",
    ...extra,
  };
}

/** The layout every chart starts from; `over` is merged one level deep. */
export function baseLayout(over = {}, t = theme()) {
  const base = {
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { family: t.font, size: 12, color: t.fg },
    margin: { ...MARGIN },
    xaxis: axis(t, { title: { text: "step", font: { color: t.muted, size: 11 } } }),
    yaxis: axis(t, { exponentformat: "power" }),
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: { size: 11 }, bgcolor: "rgba(0,0,0,0)" },
    hoverlabel: { bgcolor: t.card, bordercolor: t.border, font: { color: t.fg, family: t.font } },
    hovermode: "closest",
    showlegend: true,
  };
  const out = { ...base };
  for (const [k, v] of Object.entries(over)) {
    out[k] = v && typeof v === "object" && !Array.isArray(v) && base[k] && typeof base[k] === "object"
      ? { ...base[k], ...v } : v;
  }
  return out;
}

/** Plotly config shared by all charts. */
export function baseConfig(name) {
  return {
    responsive: true,
    displaylogo: false,
    // "sendChartToCloud" would upload the chart to Plotly's servers: never, from this tool.
    modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines", "sendChartToCloud"],
    showSendToCloud: false,
    // Plotly's zoom hint is a toast over the page's top right corner (the live indicator's
    // place): views/zoom-note.js says it in the top bar instead.
    showTips: false,
    showEditInChartStudio: false,
    toImageButtonOptions: { filename: `gradwatch-${name}`, scale: 2 },
  };
}

let listening = false;

/**
 * Charts register here to be redrawn when the colour scheme changes. The page listens for
 * the change from the first registration on, so that importing this module touches no DOM.
 */
export function registerChart(chart) {
  if (!listening) {
    listening = true;
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
      current = null;
      for (const c of charts) c.retheme();
    });
  }
  charts.add(chart);
  return () => charts.delete(chart);
}
