// A heatmap's cells painted into an image, a pixel per cell, that Plotly shows stretched over
// the cells' steps and rows (a layout image; css/app.css keeps it pixelated, so cells stay
// crisp). Plotly's own heatmap trace colours each of 300,000 cells through a general colour
// scale and encodes a PNG per trace: 150-300 ms a heatmap on the benchmark's run; a colour
// table and one Uint32 write a cell take a few milliseconds.

/** Plotly's Viridis colour scale, as plotly.js defines it. */
export const VIRIDIS = [[0, "#440154"], [0.06274509803921569, "#48186a"], [0.12549019607843137, "#472d7b"],
  [0.18823529411764706, "#424086"], [0.25098039215686274, "#3b528b"], [0.3137254901960784, "#33638d"],
  [0.3764705882352941, "#2c728e"], [0.4392156862745098, "#26828e"], [0.5019607843137255, "#21918c"],
  [0.5647058823529412, "#1fa088"], [0.6274509803921569, "#28ae80"], [0.6901960784313725, "#3fbc73"],
  [0.7529411764705882, "#5ec962"], [0.8156862745098039, "#84d44b"], [0.8784313725490196, "#addc30"],
  [0.9411764705882353, "#d8e219"], [1, "#fde725"]];

let probe = null;

/** A CSS colour as [r, g, b, a] bytes (the browser parses it: "#abc", "rgb(…)", names). */
export function rgbaOf(css) {
  probe ||= Object.assign(document.createElement("canvas"), { width: 1, height: 1 }).getContext("2d", { willReadFrequently: true });
  probe.clearRect(0, 0, 1, 1);
  probe.fillStyle = css;
  probe.fillRect(0, 0, 1, 1);
  return [...probe.getImageData(0, 0, 1, 1).data];
}

/** [r, g, b, a] as one pixel of an ImageData's Uint32Array (bytes in memory order: r, g, b, a). */
export function pixel([r, g, b, a]) {
  return new Uint32Array(new Uint8Array([r, g, b, a]).buffer)[0];
}

/** `n` pixels evenly along `scale` ([[0..1, css colour], ...]): pixel k for the position k / (n - 1). */
export function scalePixels(scale, n = 256) {
  const stops = scale.map(([at, css]) => [at, rgbaOf(css)]);
  const out = new Uint32Array(n);
  for (let k = 0; k < n; k++) {
    const at = k / (n - 1);
    let s = 1;
    while (s < stops.length - 1 && stops[s][0] < at) s++;
    const [a0, c0] = stops[s - 1];
    const [a1, c1] = stops[s];
    const f = a1 > a0 ? Math.min(1, Math.max(0, (at - a0) / (a1 - a0))) : 0;
    out[k] = pixel(c0.map((v, i) => Math.round(v + (c1[i] - v) * f)));
  }
  return out;
}

/**
 * The PNG data URL of a segment's cells: `colour(value, bits)` gives each cell's pixel (0:
 * transparent). `columnAt[p]` is the column shown in pixel column p (more pixels than columns
 * when columns are unevenly spaced); each row is `rowPx` pixels tall, its last one left blank
 * when `gap` (a line between rows tall enough for one).
 */
export function cellsImage(seg, nRows, colour, { columnAt, rowPx, gap }) {
  const width = columnAt.length;
  const canvas = Object.assign(document.createElement("canvas"), { width, height: nRows * rowPx });
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(width, nRows * rowPx);
  const pixels = new Uint32Array(image.data.buffer);
  const { cols, bits } = seg;
  const rowColours = new Uint32Array(cols.length);
  const filled = gap ? rowPx - 1 : rowPx;
  for (let i = 0; i < nRows; i++) {
    for (let j = 0; j < cols.length; j++) rowColours[j] = colour(cols[j][i], bits[j][i]);
    const top = i * rowPx * width;
    for (let p = 0; p < width; p++) pixels[top + p] = rowColours[columnAt[p]];
    for (let k = 1; k < filled; k++) pixels.copyWithin(top + k * width, top, top + width);
  }
  ctx.putImageData(image, 0, 0);
  return canvas.toDataURL("image/png");
}
