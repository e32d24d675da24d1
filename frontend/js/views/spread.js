// The spread of the gradient norms across parameters (charts/spread.js): median, quartiles and
// min..max at each step, from GET .../params/spread, live from the `step` messages' arrays.
// Zoomed to a window, the window is fetched again (step by step when it is short enough).

import { api } from "../api.js";
import { toNumbers } from "../format.js";
import { columnsOf, SpreadChart, spreadOf } from "../charts/spread.js";
import { chartCard, toggle } from "./card.js";
import { pointsFor } from "./scalars.js";
import { windowZoom } from "./zoom.js";

/** @param {{id: string, title: string, help?: string, metric: string, onXRange: Function}} o */
export function spreadView(o) {
  const tools = [toggle("log", true, (on) => chart.setLog(on), "Logarithmic y axis")];
  const { card, plot } = chartCard({ id: o.id, title: o.title, help: o.help, tools });
  const chart = new SpreadChart(plot, { name: o.id, onXRange: o.onXRange });
  let lastStep = 0;
  let fullRes = true;
  const zoomer = windowZoom(chart, {
    overviewEnough: () => fullRes,
    fetchDetail: async (ctx, win, signal) => {
      const res = await api.spread(ctx.state.runId, o.metric, { start: win[0], end: win[1], maxPoints: pointsFor(plot) }, { signal });
      return { start: win[0], end: win[1], data: columnsOf(res) };
    },
  });

  return {
    card,
    chart,
    async load(ctx) {
      zoomer.cancel();
      const res = await api.spread(ctx.state.runId, o.metric, { maxPoints: pointsFor(plot) });
      fullRes = !res.downsampled;
      const data = columnsOf(res);
      lastStep = data.step.length ? data.step[data.step.length - 1] : 0;
      await chart.setData(data);
    },
    zoom: zoomer.zoom,
    append(msgs) {
      const fresh = msgs.filter((m) => m.step > lastStep && m.params && Array.isArray(m.params[o.metric]));
      if (!fresh.length) return;
      lastStep = fresh[fresh.length - 1].step;
      chart.append(fresh.map((m) => ({ step: m.step, ...spreadOf(toNumbers(m.params[o.metric])) })));
    },
    fail: (err) => chart.fail(err),
    pointsPerSeries: () => chart.data.step.length,
    setXRange: zoomer.setXRange,
  };
}
