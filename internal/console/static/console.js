// quota-lease console: draws each quota's chart from the JSON the page
// carries and fetches the page again every data-refresh-ms, swapping its
// body in place. No dependencies, no build step.
(function () {
  'use strict';
  var SVG = 'http://www.w3.org/2000/svg';
  // Region colours avoid the modes' green, amber, red and grey.
  var COLORS = ['#3182ce', '#805ad5', '#dd6b20', '#319795', '#b83280', '#2c5282', '#6b46c1', '#975a16'];
  var STATE = { a: '#2f855a', s: '#b7791f', d: '#c53030', e: '#718096' };
  var STATE_NAME = { a: 'active', s: 'shrinking', d: 'degraded', e: 'expired' };

  function el(name, attrs, parent, text) {
    var e = document.createElementNS(SVG, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  // niceStep is the round tick interval (1, 2 or 5 times a power of ten)
  // that gives about n ticks over span.
  function niceStep(span, n) {
    var raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }

  var TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600].map(function (s) { return s * 1000; });

  function timeLabel(ms, step) {
    var d = new Date(ms), two = function (v) { return (v < 10 ? '0' : '') + v; };
    var s = two(d.getHours()) + ':' + two(d.getMinutes());
    return step < 60000 ? s + ':' + two(d.getSeconds()) : s;
  }

  // chart draws data (History.Chart: times, and per region shares in
  // percent and one state letter per sample) as stacked areas of the
  // regions' shares, a dashed line at the quota, light red bands where a
  // region was degraded, and one strip per region showing its mode.
  // W is the width in CSS pixels, so text keeps its size on a phone.
  function chart(data, W) {
    var t = data.t, regions = data.regions, n = t.length;
    var left = 54, right = 14, top = 14, plotH = 170, strip = 12;
    var stripsTop = top + plotH + 24;
    var svg = el('svg', { role: 'img' }); // its viewBox is set once the legend is laid out
    var t0 = t[0], t1 = Math.max(t[n - 1], t0 + 1000), plotW = W - left - right;
    var x = function (ms) { return left + (ms - t0) / (t1 - t0) * plotW; };
    var edge = function (i) {
      if (i < 0) return x(t[0]);
      if (i >= n - 1) return x(t[n - 1]);
      return (x(t[i]) + x(t[i + 1])) / 2;
    };
    // runs calls draw(from, to, key) for each stretch of samples with the
    // same non-empty key(i), from and to being x positions half-way to the
    // neighbouring samples: one shape per stretch, no seams between samples.
    var runs = function (n, key, draw) {
      for (var i = 0; i < n;) {
        var k = key(i), j = i;
        while (j + 1 < n && key(j + 1) === k) j++;
        if (k) draw(edge(i - 1), Math.max(edge(j), edge(i - 1) + 1), k);
        i = j + 1;
      }
    };
    var stack = [], peak = 100;
    for (var i = 0; i < n; i++) {
      var sum = 0;
      regions.forEach(function (r) { sum += Math.max(0, r.share[i]); });
      peak = Math.max(peak, sum);
    }
    var yMax = Math.ceil(peak / 25) * 25;
    var y = function (pct) { return top + plotH - pct / yMax * plotH; };
    // Degraded stretches first, under everything.
    runs(n, function (i) { return regions.some(function (r) { return r.states[i] === 'd'; }) ? 'd' : ''; }, function (from, to) {
      el('rect', { class: 'band', x: from, y: top, width: to - from, height: plotH }, svg);
    });
    // Grid and y axis.
    var ys = niceStep(yMax, 4);
    for (var v = 0; v <= yMax + 1e-9; v += ys) {
      el('line', { class: 'grid', x1: left, x2: W - right, y1: y(v), y2: y(v) }, svg);
      el('text', { x: left - 6, y: y(v) + 4, 'text-anchor': 'end' }, svg, v + '%');
    }
    el('text', { x: 12, y: top + plotH / 2, transform: 'rotate(-90 12 ' + (top + plotH / 2) + ')', 'text-anchor': 'middle' }, svg, '% of the quota');
    // Stacked areas.
    var base = t.map(function () { return 0; });
    regions.forEach(function (r, k) {
      var upper = [], lower = [];
      for (var i = 0; i < n; i++) {
        var s = Math.max(0, r.share[i]);
        upper.push(x(t[i]) + ',' + y(base[i] + s));
        lower.push(x(t[i]) + ',' + y(base[i]));
        base[i] += s;
      }
      el('polygon', { points: upper.concat(lower.reverse()).join(' '), fill: COLORS[k % COLORS.length], 'fill-opacity': 0.55,
        stroke: COLORS[k % COLORS.length], 'stroke-width': 1 }, svg);
    });
    el('line', { class: 'quota-line', x1: left, x2: W - right, y1: y(100), y2: y(100) }, svg);
    el('text', { x: W - right - 4, y: y(100) - 4, 'text-anchor': 'end' }, svg, 'quota (100%)');
    el('line', { class: 'axis', x1: left, x2: W - right, y1: top + plotH, y2: top + plotH }, svg);
    // Time ticks.
    var span = t1 - t0, step = TIME_STEPS[TIME_STEPS.length - 1];
    var ticks = Math.max(2, Math.floor(plotW / 110));
    for (i = 0; i < TIME_STEPS.length; i++) if (span / TIME_STEPS[i] <= ticks) { step = TIME_STEPS[i]; break; }
    var tz = -new Date(t0).getTimezoneOffset() * 60000;
    for (var ms = Math.ceil((t0 + tz) / step) * step - tz; ms <= t1; ms += step) {
      el('line', { class: 'axis', x1: x(ms), x2: x(ms), y1: top + plotH, y2: top + plotH + 4 }, svg);
      el('text', { x: x(ms), y: top + plotH + 16, 'text-anchor': 'middle' }, svg, timeLabel(ms, step));
    }
    // Mode strips, one per region.
    regions.forEach(function (r, k) {
      var sy = stripsTop + k * (strip + 3);
      el('text', { x: left - 6, y: sy + strip - 2, 'text-anchor': 'end' }, svg, r.name);
      runs(n, function (i) { return r.states[i]; }, function (from, to, s) {
        if (STATE[s]) el('rect', { x: from, y: sy, width: to - from, height: strip, fill: STATE[s] }, svg);
      });
    });
    // Legend: regions' colours, then the modes', wrapped to the width.
    var items = regions.map(function (r, k) { return [r.name, COLORS[k % COLORS.length]]; });
    ['a', 's', 'd', 'e'].forEach(function (s) { items.push([STATE_NAME[s], STATE[s]]); });
    var lx = left, ly = stripsTop + regions.length * (strip + 3) + 18;
    items.forEach(function (it) {
      var w = 24 + it[0].length * 7;
      if (lx > left && lx + w > W - right) { lx = left; ly += 16; }
      el('rect', { x: lx, y: ly - 9, width: 10, height: 10, fill: it[1] }, svg);
      el('text', { x: lx + 14, y: ly }, svg, it[0]);
      lx += w;
    });
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + (ly + 8));
    return svg;
  }

  function drawAll() {
    document.querySelectorAll('figure.chart').forEach(function (fig) {
      var src = document.getElementById(fig.dataset.chart);
      if (!src) return;
      var old = fig.querySelector('svg');
      if (old) old.remove();
      try {
        fig.insertBefore(chart(JSON.parse(src.textContent), Math.max(320, Math.round(fig.clientWidth))), fig.firstChild);
      } catch (e) {
        fig.insertBefore(document.createTextNode('chart failed: ' + e), fig.firstChild);
      }
    });
  }

  function refreshMs() { return Number(document.body.dataset.refreshMs) || 5000; }

  // refresh fetches this page again and swaps its body in, keeping which
  // help sections are open; on failure it says since when the page is stale.
  function refresh() {
    fetch(location.href, { cache: 'no-store', credentials: 'same-origin' }).then(function (r) {
      if (!r.ok && r.status !== 503) throw new Error('HTTP ' + r.status);
      return r.text();
    }).then(function (html) {
      var open = Array.prototype.map.call(document.querySelectorAll('details'), function (d) { return d.open; });
      var doc = new DOMParser().parseFromString(html, 'text/html');
      document.body.replaceWith(document.adoptNode(doc.body));
      document.querySelectorAll('details').forEach(function (d, i) { if (open[i]) d.open = true; });
      drawAll();
    }).catch(function (e) {
      var s = document.getElementById('stale'), u = document.getElementById('updated');
      if (s) {
        s.hidden = false;
        s.textContent = 'not updating since ' + (u ? u.textContent : '?') + ': ' + e.message;
      }
    }).finally(function () { setTimeout(refresh, refreshMs()); });
  }

  document.addEventListener('DOMContentLoaded', function () {
    drawAll();
    var resized;
    window.addEventListener('resize', function () { clearTimeout(resized); resized = setTimeout(drawAll, 200); });
    setTimeout(refresh, refreshMs());
  });
})();
