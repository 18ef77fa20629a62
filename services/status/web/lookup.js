// Recipient lookup: asks api/lookup and lists what the recipient index
// holds, newest first. Values go in as text only.
'use strict';

(() => {
  const $ = (sel) => document.querySelector(sel);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  async function lookup(to) {
    $('#lookup-error').textContent = '';
    const tbody = $('#entries tbody');
    tbody.replaceChildren();
    try {
      const res = await fetch(`api/lookup?to=${encodeURIComponent(to)}`, { cache: 'no-store' });
      const body = await res.json().catch(() => ({}));
      if (!res.ok) throw new Error(body.error || `HTTP ${res.status}`);
      $('#normalized').textContent = `${body.entries.length} outcomes for ${body.normalized}`;
      $('#normalized').dataset.count = String(body.entries.length);
      for (const e of body.entries.slice().reverse()) {
        const tr = el('tr');
        tr.dataset.task = e.task_id;
        tr.dataset.kind = e.kind;
        const task = el('td');
        const a = el('a', '', e.task_id);
        a.href = `tasks/${encodeURIComponent(e.task_id)}`;
        task.append(a);
        tr.append(el('td', 'meta', new Date(e.at).toLocaleString()), task, el('td', '', e.kind), el('td', '', e.account),
          el('td', 'num', String(e.attempt || '')), el('td', '', e.code || ''), el('td', 'error', e.error || ''));
        tbody.append(tr);
      }
    } catch (e) {
      $('#lookup-error').textContent = String(e.message || e);
    }
  }

  $('#lookup-form').addEventListener('submit', (ev) => {
    ev.preventDefault(); // the CSP allows no form action: the page asks the API itself
    const to = $('#to').value.trim();
    history.replaceState(null, '', `?to=${encodeURIComponent(to)}`);
    lookup(to);
  });
  const q = new URLSearchParams(location.search).get('to');
  if (q) {
    $('#to').value = q;
    lookup(q);
  }
})();
