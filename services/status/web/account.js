// An account's charts from api/series: sends per second and per minute,
// its effective (adaptive) rate against its ceiling, and its queue.
'use strict';

(() => {
  const $ = (sel) => document.querySelector(sel);
  const name = new URLSearchParams(location.search).get('name') || '';
  const SENDS = [
    { key: 'sent', label: 'sent', color: '#2e9d5b' },
    { key: 'retrying', label: 'retrying', color: '#e0a526' },
    { key: 'failed', label: 'failed', color: '#d2443c' },
  ];
  const RATE = [
    { key: 'rate_per_sec', label: 'effective rate /s', color: '#2f6fde', summary: 'max' },
    { key: 'ceiling', label: 'ceiling /s', color: '#6b7385', dash: '5 4', summary: 'max' },
    { key: 'queue_depth', label: 'queued', color: '#b07ad6', axis: 'right', summary: 'max' },
  ];
  const DAILY = [
    { key: 'daily_used', label: 'used', color: '#2f6fde', summary: 'max' },
    { key: 'daily_cap', label: 'cap (0: none)', color: '#6b7385', dash: '5 4', summary: 'max' },
  ];
  $('#account-name').textContent = name;
  async function charts() {
    try {
      const res = await fetch(`api/series?account=${encodeURIComponent(name)}&seconds=600`, { cache: 'no-store' });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      const s = await res.json();
      $('#no-series').hidden = true;
      window.broadcastChart.draw($('#chart-sends'), $('#legend-sends'), s.per_second, SENDS);
      window.broadcastChart.draw($('#chart-rate'), $('#legend-rate'), s.per_second, RATE);
      window.broadcastChart.draw($('#chart-daily'), $('#legend-daily'), s.per_minute, DAILY);
      window.broadcastChart.draw($('#chart-minutes'), $('#legend-minutes'), s.per_minute, SENDS);
      $('#updated').textContent = 'updated ' + new Date().toLocaleTimeString();
    } catch (e) {
      $('#no-series').hidden = false;
    }
  }
  charts();
  setInterval(charts, 1000);
})();
