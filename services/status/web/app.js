// Broadcast dashboard: renders the snapshots the status service streams on
// api/events. Every value from the server goes into the page through
// textContent or dataset, never as HTML, so task ids and error messages
// cannot inject markup.
'use strict';

(() => {
  const FINAL = new Set(['succeeded', 'partial', 'failed', 'cancelled', 'rejected']);
  // Bar segments, in drawing order.
  const SEGMENTS = ['sent', 'failed', 'skipped', 'expired', 'cancelled', 'retrying'];
  const COUNTS = ['total', 'sent', 'retrying', 'failed', 'skipped', 'expired', 'cancelled', 'delivered', 'read', 'undelivered'];
  const ACTIONS = [
    ['pause', 'Pause', ''],
    ['resume', 'Resume', ''],
    ['cancel', 'Cancel', 'danger'],
    ['retry-dead', 'Retry dead', ''],
  ];
  const taskRows = new Map();
  const accountRows = new Map();
  const $ = (sel) => document.querySelector(sel);

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  const fmtInt = (n) => (n || 0).toLocaleString('en-US');

  function fmtRate(r) {
    if (!(r > 0)) return '–';
    return (r >= 100 ? r.toFixed(0) : r.toFixed(1)) + '/s';
  }

  function fmtDuration(secs) {
    secs = Math.round(secs);
    const h = Math.floor(secs / 3600);
    const m = Math.floor((secs % 3600) / 60);
    const s = secs % 60;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${s}s`;
    return `${s}s`;
  }

  function fmtTime(iso) {
    if (!iso || iso.startsWith('0001-')) return '';
    const d = new Date(iso);
    return isNaN(d) ? '' : d.toLocaleString();
  }

  // ---- tasks ----

  // taskLink leads to the task's story page (tasks/<id>).
  function taskLink(id) {
    const d = el('div', 'task-id');
    const a = el('a', '', id);
    a.href = `tasks/${encodeURIComponent(id)}`;
    d.append(a);
    return d;
  }

  function buildTaskRow(id) {
    const tr = el('tr');
    tr.dataset.task = id;
    const f = {};
    const cell = (cls) => {
      const c = el('td', cls);
      tr.append(c);
      return c;
    };
    const field = (node, name) => {
      node.dataset.field = name;
      f[name] = node;
      return node;
    };
    const c0 = cell('task');
    c0.append(field(taskLink(id), 'id'), field(el('div', 'meta'), 'meta'), field(el('div', 'error'), 'error'));
    cell().append(field(el('span', 'state'), 'state'));
    const cb = cell('bar-col');
    f.bar = el('div', 'bar');
    f.segs = {};
    for (const k of SEGMENTS) {
      const s = el('span', k);
      s.title = k;
      f.segs[k] = s;
      f.bar.append(s);
    }
    cb.append(f.bar, field(el('div', 'bar-label'), 'done'));
    for (const k of COUNTS) field(cell('num'), k);
    field(cell('num'), 'rate');
    field(cell('num'), 'eta');
    const ca = cell('actions');
    f.buttons = {};
    for (const [action, label, cls] of ACTIONS) {
      const b = el('button', cls, label);
      b.type = 'button';
      b.dataset.action = action;
      b.addEventListener('click', () => control(id, action, f));
      f.buttons[action] = b;
      ca.append(b);
    }
    ca.append(field(el('div', 'reply'), 'reply'));
    return { tr, f };
  }

  function updateTaskRow(f, p) {
    const state = p.state || 'pending';
    setText(f.state, state.replace('_', ' '));
    f.state.dataset.state = state;
    f.state.dataset.value = state;
    const meta = [p.channel, p.priority && p.priority !== 'normal' ? p.priority + ' priority' : '',
      fmtTime(p.created_at) && 'created ' + fmtTime(p.created_at)].filter(Boolean).join(' · ');
    setText(f.meta, meta);
    setText(f.error, p.error || '');
    for (const k of COUNTS) {
      setText(f[k], fmtInt(p[k]));
      f[k].dataset.value = String(p[k] || 0);
    }
    const total = p.total || 0;
    for (const k of SEGMENTS) {
      const w = total > 0 ? Math.min(100, (100 * (p[k] || 0)) / total) : 0;
      const css = w.toFixed(3) + '%';
      if (f.segs[k].style.width !== css) f.segs[k].style.width = css;
    }
    const done = (p.sent || 0) + (p.failed || 0) + (p.skipped || 0) + (p.expired || 0) + (p.cancelled || 0);
    let label = total > 0 ? `${Math.floor((100 * done) / total)}% done` : state === 'rejected' ? 'not accepted' : 'no recipients yet';
    if (done > 0) label += ` · ${(100 * (p.success_rate || 0)).toFixed(1)}% sent ok`;
    if (p.duplicates) label += ` · ${fmtInt(p.duplicates)} duplicates dropped`;
    setText(f.done, label);
    setText(f.rate, fmtRate(p.rate_per_sec));
    // An ETA only means something while the task sends.
    setText(f.eta, state === 'processing' && p.eta_seconds > 0 ? fmtDuration(p.eta_seconds) : '–');

    const b = f.buttons;
    b.pause.hidden = state !== 'processing';
    b.resume.hidden = !['paused', 'awaiting_approval', 'scheduled'].includes(state);
    setText(b.resume, state === 'awaiting_approval' ? 'Approve' : state === 'scheduled' ? 'Start now' : 'Resume');
    b.cancel.hidden = FINAL.has(state);
    b['retry-dead'].hidden = !(p.failed > 0);
  }

  async function control(id, action, f) {
    if (action === 'cancel' && !window.confirm(`Cancel task ${id}? Recipients not sent yet will not get the message.`)) {
      return;
    }
    const buttons = Object.values(f.buttons);
    buttons.forEach((b) => { b.disabled = true; });
    f.reply.classList.remove('err');
    setText(f.reply, `${action}…`);
    try {
      const res = await fetch(`api/tasks/${encodeURIComponent(id)}/${encodeURIComponent(action)}`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: '{}',
      });
      let body = {};
      try {
        body = await res.json();
      } catch (_) {
        // not JSON: the status line says enough
      }
      if (res.ok && body.ok) {
        let msg = `${action}: ok, ${(body.state || '').replace('_', ' ')}`;
        if (body.requeued) msg += ` (${body.requeued} re-queued)`;
        setText(f.reply, msg);
      } else {
        f.reply.classList.add('err');
        setText(f.reply, `${action} failed: ${body.error || `${res.status} ${res.statusText}`}`);
      }
    } catch (err) {
      f.reply.classList.add('err');
      setText(f.reply, `${action} failed: ${err.message}`);
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
  }

  // ---- accounts ----

  function buildAccountRow(name) {
    const tr = el('tr');
    tr.dataset.account = name;
    const f = {};
    const cell = (cls, fieldName) => {
      const c = el('td', cls);
      if (fieldName) {
        c.dataset.field = fieldName;
        f[fieldName] = c;
      }
      tr.append(c);
      return c;
    };
    cell('task-id').textContent = name;
    cell('', 'channel');
    cell('', 'enabled');
    const h = cell();
    f.health = el('span', 'state');
    f.health.dataset.field = 'health';
    f.reason = el('div', 'error');
    f.reason.dataset.field = 'reason';
    h.append(f.health, f.reason);
    const rb = cell('bar-col');
    f.bar = el('div', 'bar');
    f.rateSeg = el('span', 'rate');
    f.bar.append(f.rateSeg);
    f.rate = el('div', 'bar-label');
    f.rate.dataset.field = 'rate';
    rb.append(f.bar, f.rate);
    cell('num', 'daily');
    cell('', 'quality');
    cell('num', 'score');
    cell('num', 'queue');
    cell('num', 'inflight');
    return { tr, f };
  }

  function updateAccountRow(f, a) {
    setText(f.channel, a.channel);
    setText(f.enabled, a.enabled ? 'yes' : 'no');
    setText(f.health, a.state);
    f.health.dataset.state = a.state === 'paused' ? 'failed' : 'succeeded';
    setText(f.reason, a.reason || '');
    const ceiling = a.ceiling || 0;
    const w = ceiling > 0 ? Math.min(100, (100 * (a.rate_per_sec || 0)) / ceiling) : 0;
    f.rateSeg.style.width = w.toFixed(2) + '%';
    const eff = a.health_at ? fmtRate(a.rate_per_sec) : 'not reported';
    setText(f.rate, `${eff} of ${fmtRate(ceiling)}`);
    let daily = `${fmtInt(a.daily_used)} / ${a.daily_cap > 0 ? fmtInt(a.daily_cap) : '–'}`;
    if (a.warmup_cap > 0) daily += ` (warm-up day ${a.warmup_day || 0})`;
    if (a.portfolio) {
      const pc = a.portfolio_cap > 0 ? fmtInt(a.portfolio_cap) : '–';
      daily += `; portfolio ${a.portfolio} ${fmtInt(a.portfolio_used || 0)} / ${pc}`;
    }
    setText(f.daily, daily);
    setText(f.quality, (a.quality || '–') + (a.quality_reason ? ': ' + a.quality_reason : ''));
    setText(f.score, a.score ? String(a.score.score) : '–');
    setText(f.queue, fmtInt(a.queue_depth));
    setText(f.inflight, fmtInt(a.in_flight));
  }

  // ---- rendering ----

  function place(tbody, rows, items, key, build, update) {
    const seen = new Set();
    items.forEach((item, i) => {
      const id = item[key];
      seen.add(id);
      let r = rows.get(id);
      if (!r) {
        r = build(id);
        rows.set(id, r);
      }
      update(r.f, item);
      if (tbody.children[i] !== r.tr) tbody.insertBefore(r.tr, tbody.children[i] || null);
    });
    for (const [id, r] of rows) {
      if (!seen.has(id)) {
        r.tr.remove();
        rows.delete(id);
      }
    }
  }

  function render(snap) {
    const tasks = snap.tasks || [];
    const accounts = snap.accounts || [];
    place($('#tasks tbody'), taskRows, tasks, 'task_id', buildTaskRow, updateTaskRow);
    place($('#accounts tbody'), accountRows, accounts, 'name', buildAccountRow, updateAccountRow);
    $('#no-tasks').hidden = tasks.length > 0;
    $('#no-accounts').hidden = accounts.length > 0;
    const more = $('#more');
    more.hidden = !(snap.more > 0);
    setText(more, snap.more > 0 ? `${fmtInt(snap.more)} older finished tasks not shown.` : '');
    if (snap.at) setText($('#updated'), 'updated ' + new Date(snap.at).toLocaleTimeString());
  }

  // ---- connection ----

  let lastSnapshot = 0;

  function setConn(state, text) {
    const c = $('#conn');
    c.dataset.state = state;
    setText(c, text);
  }

  function received(snap) {
    lastSnapshot = Date.now();
    setConn('live', 'live');
    render(snap);
  }

  // The server sends a snapshot at least once a second; silence means the
  // connection is gone even when the browser has not noticed.
  setInterval(() => {
    if (lastSnapshot && Date.now() - lastSnapshot > 3000) setConn('reconnecting', 'reconnecting…');
  }, 1000);

  async function poll() {
    try {
      const [t, a] = await Promise.all([fetch('api/tasks'), fetch('api/accounts')]);
      const tasks = await t.json();
      const accounts = await a.json();
      received({ tasks: tasks.tasks, more: tasks.more, accounts: accounts.accounts, at: new Date().toISOString() });
    } catch (err) {
      setConn('reconnecting', 'reconnecting…');
    }
  }

  if (window.EventSource) {
    const es = new EventSource('api/events');
    es.addEventListener('snapshot', (e) => received(JSON.parse(e.data)));
    es.addEventListener('error', () => setConn('reconnecting', 'reconnecting…'));
  } else {
    poll();
    setInterval(poll, 1000);
  }
})();
