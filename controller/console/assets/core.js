// Loom Console: what every page uses (elements, the API, formatting,
// tables, live streams) and the current page's clean-ups.
export const main = document.getElementById('main');
export const session = {
  name: '',
  role: '',
  csrf: '',
  consoles: [],  // every console over this store (the login answer)
  base: ''       // where the API is called: '' (this page's origin) or a peer's
};
export const cleanups = [];  // closes the current page's streams and timers

// ---------------------------------------------------------------- helpers

// An element: h('a', {href: '/x', class: 'c'}, 'text', child, ...). Strings
// become text nodes; attributes starting with "on" are listeners.
export function h(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on'))
      e.addEventListener(k.slice(2), v);
    else if (k === 'class')
      e.className = v;
    else
      e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === undefined || kid === null || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

export function show(...nodes) {
  main.replaceChildren(...nodes);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// Calls the JSON API. `query`: an object (arrays repeat the parameter).
export async function api(path, {method = 'GET', body, query} = {}) {
  let url = session.base + '/api/v1/' + path;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) {
      if (v === undefined || v === null || v === '') continue;
      for (const one of Array.isArray(v) ? v : [v]) q.append(k, String(one));
    }
    const s = q.toString();
    if (s) url += '?' + s;
  }
  const init = {method, credentials: session.base ? 'include' : 'same-origin', headers: {}};
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  if (method !== 'GET' && session.csrf) init.headers['X-Loom-CSRF'] = session.csrf;
  const res = await fetch(url, init);
  const text = await res.text();
  let data = {};
  try {
    data = text ? JSON.parse(text) : {};
  } catch (e) {
    data = {message: text};
  }
  if (!res.ok) {
    if (res.status === 401 && !location.pathname.startsWith('/login')) {
      go('/login?next=' + encodeURIComponent(location.pathname + location.search), true);
    }
    throw new ApiError(res.status, data.code || String(res.status), data.message || res.statusText);
  }
  return data;
}

export function num(v) {
  const n = Number(v);
  return Number.isFinite(n) ? n : NaN;
}

export function fmt(v, digits = 4) {
  const n = num(v);
  if (!Number.isFinite(n)) return '–';
  if (n !== 0 && (Math.abs(n) >= 1e6 || Math.abs(n) < 1e-3)) return n.toExponential(2);
  return Number.isInteger(n) ? String(n) : n.toPrecision(digits);
}

export function when(ms) {
  const n = num(ms);
  if (!n) return '–';
  return new Date(n).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

export function duration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return '–';
  const s = Math.round(seconds);
  if (s < 120) return s + ' s';
  if (s < 7200) return Math.round(s / 60) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}

export function badge(state) {
  return h('span', {class: 'badge ' + (state || '')}, state || '?');
}

export function errorBox(e) {
  return h('p', {class: 'error'}, (e && e.message) || String(e));
}

// A sortable table: columns [{label, get(row) -> value, show(row) -> node?, num}].
export function table(columns, rows, {sortBy = -1, desc = false} = {}) {
  const wrap = h('div', {class: 'scroll'});
  let key = sortBy, down = desc;
  const render = () => {
    const sorted = rows.slice();
    if (key >= 0) {
      const get = columns[key].get;
      sorted.sort((a, b) => {
        const x = get(a), y = get(b);
        const c = typeof x === 'number' && typeof y === 'number' ?
            x - y :
            String(x).localeCompare(String(y));
        return down ? -c : c;
      });
    }
    const head =
        h('tr', {},
          columns.map(
              (c, i) =>
                  h('th', {
                    class: c.num ? 'num' : '',
                    onclick: () => {
                      down = key === i ? !down : false;
                      key = i;
                      render();
                    },
                  },
                    c.label + (key === i ? (down ? ' ▼' : ' ▲') : ''))));
    const body = sorted.map(
        (r) =>
            h('tr', {},
              columns.map(
                  (c) =>
                      h('td', {class: c.num ? 'num' : ''},
                        c.show ? c.show(r) : String(c.get(r) ?? '–')))));
    wrap.replaceChildren(h('table', {}, h('thead', {}, head), h('tbody', {}, body)));
  };
  render();
  return wrap;
}

export function stat(label, value) {
  return h(
      'div', {class: 'stat'}, h('div', {class: 'label'}, label), h('div', {class: 'value'}, value));
}

// A live stream of events (Server-Sent Events). The browser reconnects by
// itself with Last-Event-ID; `onReconnect` runs after each reconnect, for
// what the stream does not replay (steps). When the console that serves the
// stream stops answering (its controller died), the page asks the other
// consoles over the same store and goes on at the one that leads, from the
// last event it had (followLeader).
export function stream(path, handlers, onReconnect) {
  let es = null;
  let lastId = '';
  let lost = false;
  let closed = false;
  let probe = null;
  const open = () => {
    let url = session.base + '/api/v1/' + path;
    if (lastId) url += (url.includes('?') ? '&' : '?') + 'after_seq=' + encodeURIComponent(lastId);
    es = new EventSource(url, {withCredentials: !!session.base});
    for (const [kind, fn] of Object.entries(handlers)) {
      es.addEventListener(kind, (m) => {
        if (m.lastEventId) lastId = m.lastEventId;
        try {
          fn(JSON.parse(m.data));
        } catch (e) {
          console.error(e);
        }
      });
    }
    es.addEventListener('end', (m) => {
      const end = JSON.parse(m.data);
      if (end.code === 'OK' || end.code === 'UNAUTHENTICATED' || end.code === 'PERMISSION_DENIED' ||
          end.code === 'NOT_FOUND')
        stop();
    });
    es.onerror = () => {
      lost = true;
      if (!probe && !closed) probe = setTimeout(check, 1500);
    };
    es.onopen = () => {
      if (lost && onReconnect) onReconnect();
      lost = false;
    };
  };
  // Still not reconnected: find the leader's console and go on there.
  const check = async () => {
    probe = null;
    if (closed || (es && es.readyState === EventSource.OPEN)) return;
    const moved = await followLeader();
    if (closed) return;
    if (moved) {
      es.close();
      open();
      lost = true;  // onopen re-reads what the stream does not replay
    } else {
      probe = setTimeout(check, 2000);
    }
  };
  const stop = () => {
    closed = true;
    if (probe) clearTimeout(probe);
    if (es) es.close();
  };
  open();
  cleanups.push(stop);
  return {close: stop};
}

// Finds the console that answers for the store now: this page's own first,
// then every other the login listed. True when that is another than the
// one the page used (session.base is then set to it, and a notice says
// so); false when the current one answers, or none does.
let following = null;
export function followLeader() {
  if (!following) following = findLeader().finally(() => following = null);
  return following;
}

async function findLeader() {
  const current = session.base || location.origin;
  for (const c of [current, ...session.consoles.filter((c) => c !== current)]) {
    let res = null;
    try {
      res = await fetch(c + '/api/v1/whoami', {
        credentials: c === location.origin ? 'same-origin' : 'include',
        redirect: 'manual',  // a standby's 307 names a leader that may be gone
        cache: 'no-store',
        signal: AbortSignal.timeout(2000)
      });
    } catch (e) {
      continue;  // not answering: the next one
    }
    if (!res.ok) continue;
    if (c === current) return false;
    session.base = c === location.origin ? '' : c;
    const note = document.getElementById('moved');
    note.replaceChildren(
        'The controller that served this page stopped answering; the page now follows the ' +
            'leader at ',
        h('a', {href: c + location.pathname + location.search}, c), '.');
    note.hidden = false;
    return true;
  }
  return false;
}

// Marks (performance.mark) the first time `name` is painted on this page,
// for the browser's own timing of it (./bench/run.sh console): after the
// next frame.
export function markPainted(name) {
  const mark = () => {
    if (!performance.getEntriesByName(name).length) performance.mark(name);
  };
  if (!performance.getEntriesByName(name).length) requestAnimationFrame(() => setTimeout(mark, 0));
}

// Set by console.js: draws the page of the current URL.
export const router = {
  render: null
};

export function go(url, replace = false) {
  if (replace) {
    history.replaceState(null, '', url);
  } else {
    history.pushState(null, '', url);
  }
  router.render();
}
