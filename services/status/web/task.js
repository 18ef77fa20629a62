// A task's story: its progress, its sends over time, why recipients
// failed, its dead letters (with a retry of all or a selection) and its
// events. Every value from the server goes into the page through
// textContent or dataset, never as HTML.
'use strict';

(() => {
  const id = decodeURIComponent(location.pathname.split('/').filter(Boolean).pop() || '');
  const api = (path) => `../api/${path}`;
  const $ = (sel) => document.querySelector(sel);
  const PAGE = 50;
  const LINES = [
    { key: 'sent', label: 'sent', color: '#2e9d5b' },
    { key: 'retrying', label: 'retrying', color: '#e0a526' },
    { key: 'failed', label: 'failed', color: '#d2443c' },
    { key: 'delivered', label: 'delivered', color: '#2f6fde', dash: '4 3' },
    { key: 'read', label: 'read', color: '#7a4fd0', dash: '2 3' },
  ];
  let deadOffset = 0;
  let deadTotal = 0;
  let lastFailed = -1;
  let eventsAfter = 0;
  let ticks = 0;
  let failuresAt = 0;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  const fmtTime = (iso) => {
    if (!iso || iso.startsWith('0001-')) return '';
    const d = new Date(iso);
    return isNaN(d) ? '' : d.toLocaleString();
  };

  async function getJSON(path) {
    const res = await fetch(api(path), { cache: 'no-store' });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(body.error || `HTTP ${res.status}`);
    return body;
  }

  async function progress() {
    try {
      const p = await getJSON(`tasks/${encodeURIComponent(id)}`);
      const st = $('#state');
      st.textContent = p.state;
      st.dataset.state = p.state;
      const c = $('#counts');
      for (const k of ['total', 'sent', 'retrying', 'failed', 'skipped', 'expired', 'cancelled', 'delivered', 'read']) c.dataset[k] = String(p[k] || 0);
      c.textContent = `${p.total} recipients: ${p.sent} sent, ${p.retrying} retrying, ${p.failed} failed, ` +
        `${p.skipped} skipped, ${p.expired} expired, ${p.cancelled} cancelled; ${p.delivered || 0} delivered, ` +
        `${p.read || 0} read; ${(p.rate_per_sec || 0).toFixed(1)}/s`;
      $('#task-error').textContent = p.error || '';
      $('#updated').textContent = 'updated ' + new Date().toLocaleTimeString();
      // Dead letters are reloaded on a change of the counts and every few
      // seconds (a retry can take letters out of DEAD and put them back
      // between two polls); the failure groups, which read every dead
      // letter and skipped event of the task, on a change at most every
      // five seconds.
      const changed = p.failed + p.skipped !== lastFailed;
      if (changed || ++ticks % 3 === 0) dead();
      if (changed && Date.now() - failuresAt >= 5000) {
        lastFailed = p.failed + p.skipped;
        failuresAt = Date.now();
        failures();
      }
    } catch (e) {
      $('#task-error').textContent = String(e.message || e);
    }
  }

  async function charts() {
    try {
      const s = await getJSON(`series?task=${encodeURIComponent(id)}&seconds=600`);
      $('#no-series').hidden = true;
      window.broadcastChart.draw($('#chart-seconds'), $('#legend-seconds'), s.per_second, LINES);
      window.broadcastChart.draw($('#chart-minutes'), $('#legend-minutes'), s.per_minute, LINES);
    } catch (e) {
      $('#no-series').hidden = false;
    }
  }

  async function failures() {
    try {
      const f = await getJSON(`tasks/${encodeURIComponent(id)}/failures`);
      const tbody = $('#failures tbody');
      tbody.replaceChildren();
      for (const g of f.groups) {
        const tr = el('tr');
        tr.dataset.kind = g.kind;
        tr.dataset.code = g.code;
        tr.dataset.account = g.account;
        tr.dataset.count = String(g.count);
        tr.append(el('td', '', g.kind), el('td', '', g.code || '–'), accountCell(g.account), el('td', 'num', String(g.count)));
        const ex = el('td');
        ex.append(el('div', '', g.example.to), el('div', 'error', g.example.error), el('div', 'meta', fmtTime(g.example.at)));
        tr.append(ex);
        tbody.append(tr);
      }
      $('#no-failures').hidden = f.groups.length > 0;
    } catch (e) {
      $('#no-failures').textContent = String(e.message || e);
    }
  }

  function accountCell(name) {
    const td = el('td');
    if (name) {
      const a = el('a', '', name);
      a.href = `../account.html?name=${encodeURIComponent(name)}`;
      td.append(a);
    }
    return td;
  }

  async function dead() {
    try {
      const d = await getJSON(`tasks/${encodeURIComponent(id)}/dead?offset=${deadOffset}&limit=${PAGE}`);
      deadTotal = d.total;
      if (deadOffset > 0 && deadOffset >= d.total) {
        deadOffset = Math.max(0, Math.floor((d.total - 1) / PAGE) * PAGE);
        return dead();
      }
      $('#dead-total').textContent = `(${d.total})`;
      $('#dead-total').dataset.total = String(d.total);
      $('#dead-range').textContent = d.total ? `${d.offset + 1}–${d.offset + d.letters.length} of ${d.total}` : 'none';
      $('#dead-prev').disabled = d.offset === 0;
      $('#dead-next').disabled = d.offset + d.letters.length >= d.total;
      $('#retry-all').disabled = d.total === 0;
      $('#dead-all').checked = false;
      const tbody = $('#dead tbody');
      tbody.replaceChildren();
      for (const l of d.letters) {
        const tr = el('tr');
        tr.dataset.seq = String(l.seq);
        tr.dataset.to = l.to;
        const box = el('input');
        box.type = 'checkbox';
        box.value = String(l.seq);
        box.setAttribute('aria-label', 'select ' + l.to);
        const c0 = el('td');
        c0.append(box);
        const attempts = el('td');
        for (const a of l.attempts) {
          attempts.append(el('div', 'attempt', `#${a.attempt} ${a.code || '–'}: ${a.error}`));
        }
        tr.append(c0, el('td', 'task-id', l.to), accountCell(l.account), attempts, el('td', 'meta', fmtTime(l.at)));
        tbody.append(tr);
      }
    } catch (e) {
      $('#retry-reply').textContent = String(e.message || e);
    }
  }

  async function retry(seqs) {
    const reply = $('#retry-reply');
    reply.classList.remove('err');
    reply.textContent = 'retrying…';
    try {
      const res = await fetch(api(`tasks/${encodeURIComponent(id)}/retry-dead`), {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(seqs ? { seqs } : {}),
      });
      const body = await res.json().catch(() => ({}));
      if (!res.ok || !body.ok) throw new Error(body.error || `HTTP ${res.status}`);
      reply.textContent = `re-queued ${body.requeued || 0}`;
      reply.dataset.requeued = String(body.requeued || 0);
    } catch (e) {
      reply.classList.add('err');
      reply.textContent = 'retry failed: ' + (e.message || e);
    }
    lastFailed = -1; // reload failures and dead letters
    failuresAt = 0;
    progress();
  }

  async function events(more) {
    const kind = $('#event-kind').value;
    if (!more) eventsAfter = 0;
    try {
      const q = `tasks/${encodeURIComponent(id)}/events?limit=100&after=${eventsAfter}` + (kind ? `&kind=${encodeURIComponent(kind)}` : '');
      const page = await getJSON(q);
      const tbody = $('#events tbody');
      if (!more) tbody.replaceChildren();
      for (const e of page.events) {
        const tr = el('tr');
        tr.dataset.kind = e.kind;
        tr.append(el('td', 'num', String(e.seq)), el('td', 'meta', fmtTime(e.at)), el('td', '', e.kind),
          el('td', '', e.to), accountCell(e.account), el('td', 'num', String(e.attempt || '')),
          el('td', '', e.code || ''), el('td', 'error', e.error || ''));
        tbody.append(tr);
      }
      // "More" reads on from the last event shown: the next page, or the
      // events that arrived since.
      eventsAfter = page.next || (page.events.length ? page.events[page.events.length - 1].seq : eventsAfter);
      $('#events-note').textContent = page.events.length ? '' : 'no newer events';
    } catch (e) {
      $('#events-more').textContent = String(e.message || e);
    }
  }

  $('#task-id').textContent = id;
  document.title = 'Broadcast: ' + id;
  $('#dead-prev').addEventListener('click', () => { deadOffset = Math.max(0, deadOffset - PAGE); dead(); });
  $('#dead-next').addEventListener('click', () => { if (deadOffset + PAGE < deadTotal) { deadOffset += PAGE; dead(); } });
  $('#dead-all').addEventListener('change', (ev) => {
    for (const b of document.querySelectorAll('#dead tbody input[type=checkbox]')) b.checked = ev.target.checked;
  });
  $('#retry-selected').addEventListener('click', () => {
    const seqs = [...document.querySelectorAll('#dead tbody input[type=checkbox]:checked')].map((b) => Number(b.value));
    if (seqs.length === 0) {
      $('#retry-reply').textContent = 'select dead letters first';
      return;
    }
    retry(seqs);
  });
  $('#retry-all').addEventListener('click', () => retry(null));
  $('#event-kind').addEventListener('change', () => events(false));
  $('#events-more').addEventListener('click', () => events(true));
  progress();
  charts();
  events(false);
  setInterval(progress, 1000);
  setInterval(charts, 1000);
})();
