// Broadcast charts: draws a series range from api/series as lines in an
// inline SVG (no library, nothing fetched from elsewhere). The SVG's
// dataset says what was drawn (points, sums, the last step's start), so
// tests and people can read the numbers behind the lines.
'use strict';

window.broadcastChart = (() => {
  const NS = 'http://www.w3.org/2000/svg';
  const W = 900, H = 180, PAD = 28;

  function node(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // draw replaces svg's content with one polyline per line in lines
  // ([{key, label, color, dash, axis, summary}]): axis 'right' puts a line
  // on its own scale, summary 'max' labels it with its largest value
  // rather than its total; range is a SeriesRange.
  function draw(svg, legend, range, lines) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const n = (range && range.sent) ? range.sent.length : 0;
    svg.dataset.points = String(n);
    svg.dataset.start = range ? range.start : '';
    const maxOf = (axis) => Math.max(1, ...lines.filter((l) => (l.axis || 'left') === axis)
      .flatMap((l) => range[l.key] || [0]));
    const max = { left: maxOf('left'), right: maxOf('right') };
    svg.append(node('line', { x1: PAD, y1: H - PAD, x2: W - 4, y2: H - PAD, stroke: '#c9ced8' }));
    svg.append(node('text', { x: 2, y: 12, 'font-size': 10, fill: '#6b7385' }, String(max.left)));
    svg.append(node('text', { x: 2, y: H - PAD, 'font-size': 10, fill: '#6b7385' }, '0'));
    if (lines.some((l) => l.axis === 'right')) {
      svg.append(node('text', { x: W - 40, y: 12, 'font-size': 10, fill: '#6b7385' }, String(max.right) + ' ▸'));
    }
    if (range) {
      const t0 = new Date(range.start);
      svg.append(node('text', { x: PAD, y: H - 8, 'font-size': 10, fill: '#6b7385' }, t0.toLocaleTimeString()));
      const t1 = new Date(t0.getTime() + Math.max(0, n - 1) * range.step_seconds * 1000);
      svg.append(node('text', { x: W - 70, y: H - 8, 'font-size': 10, fill: '#6b7385' }, t1.toLocaleTimeString()));
    }
    if (legend) while (legend.firstChild) legend.removeChild(legend.firstChild);
    for (const l of lines) {
      const vals = (range && range[l.key]) || [];
      const sum = vals.reduce((a, b) => a + b, 0);
      svg.dataset['sum' + l.key.replace(/(^|_)(\w)/g, (_, __, c) => c.toUpperCase())] = String(Math.round(sum * 100) / 100);
      if (vals.length === 0) continue;
      const m = max[l.axis || 'left'];
      const step = vals.length > 1 ? (W - PAD - 4) / (vals.length - 1) : 0;
      const pts = vals.map((v, i) => `${(PAD + i * step).toFixed(1)},${(H - PAD - (v / m) * (H - 2 * PAD)).toFixed(1)}`);
      if (vals.length === 1) {
        const [x, y] = pts[0].split(',');
        svg.append(node('circle', { cx: x, cy: y, r: 3, fill: l.color, 'data-line': l.key }));
      }
      svg.append(node('polyline', { points: pts.join(' '), fill: 'none', stroke: l.color, 'stroke-width': 1.6,
        'stroke-dasharray': l.dash || '', 'data-line': l.key }));
      if (legend) {
        const item = document.createElement('span');
        item.className = 'legend-item';
        const sw = document.createElement('span');
        sw.className = 'swatch swatch-' + l.key;
        item.append(sw, document.createTextNode(`${l.label} (${l.summary === 'max' ? 'max ' + Math.max(...vals) : 'total ' + sum}${l.axis === 'right' ? ', right scale' : ''})`));
        legend.append(item);
      }
    }
  }

  return { draw };
})();
