// The live feed: one `GET /api/v1/events` stream for the whole page, read
// with fetch (EventSource cannot send an Authorization header). It resumes
// after a disconnect with Last-Event-ID, so nothing is missed or repeated;
// when the master says events were lost (`dropped`: past retention, too
// slow), the views read everything again.

import { authHeaders, refused, token } from './api.js';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export class Live {
  constructor() {
    this.handlers = new Set();
    this.lastId = null;
    this.state = 'connecting';
    this.lagMs = null;
    this.received = 0;
    this.needResync = false;
    this.stateListeners = new Set();
    this.resyncListeners = new Set();
    this.connected = new Promise((r) => { this.markConnected = r; });
  }

  /** `fn(event)` for each event; returns the unsubscribe. */
  subscribe(fn) { this.handlers.add(fn); return () => this.handlers.delete(fn); }
  onState(fn) { this.stateListeners.add(fn); }
  /** `fn()` when events may have been missed: read everything again. */
  onResync(fn) { this.resyncListeners.add(fn); return () => this.resyncListeners.delete(fn); }

  setState(s, detail = '') {
    this.state = s;
    for (const fn of this.stateListeners) fn(s, detail);
  }

  async run() {
    let backoff = 250;
    let connectedBefore = false;
    for (;;) {
      if (!token()) { await sleep(500); continue; }
      this.ctrl = new AbortController();
      try {
        const headers = authHeaders({ Accept: 'text/event-stream' });
        // Without an id to resume from (none seen yet, or the master said
        // events were lost), a reconnect cannot replay the gap: the views
        // read everything again once it is live.
        const resync = this.needResync || (connectedBefore && this.lastId === null);
        if (this.lastId !== null) headers['Last-Event-ID'] = String(this.lastId);
        const rsp = await fetch('/api/v1/events', { headers, signal: this.ctrl.signal, cache: 'no-store' });
        if (!rsp.ok) {
          const body = await rsp.json().catch(() => ({}));
          throw refused(rsp.status, body.error?.code || String(rsp.status), body.error?.message || rsp.statusText);
        }
        this.setState('live');
        this.markConnected();
        connectedBefore = true;
        backoff = 250;
        if (resync) {
          this.needResync = false;
          for (const fn of this.resyncListeners) fn();
        }
        await this.read(rsp.body);
        this.setState('reconnecting', 'the stream ended');
      } catch (e) {
        this.setState('reconnecting', e.message);
      }
      await sleep(backoff + Math.random() * backoff / 2);
      backoff = Math.min(backoff * 2, 5000);
    }
  }

  /** Reads one stream to its end. */
  async read(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      let end;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        this.dispatch(block);
      }
    }
  }

  /** One SSE block. The master's final `dropped` means events were lost. */
  dispatch(block) {
    let id; let kind = 'message'; const data = [];
    for (const line of block.split('\n')) {
      if (line === '' || line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'id') id = value;
      else if (field === 'event') kind = value;
      else if (field === 'data') data.push(value);
    }
    if (id !== undefined) this.lastId = id === '' ? null : Number(id);
    if (kind === 'dropped') { this.needResync = true; return; }
    if (data.length === 0) return;
    let e;
    try { e = JSON.parse(data.join('\n')); } catch { return; }
    this.received += 1;
    const at = Date.parse(e.at);
    if (!Number.isNaN(at)) {
      this.lagMs = Math.max(0, Date.now() - at);
      this.maxLagMs = Math.max(this.maxLagMs ?? 0, this.lagMs);
    }
    for (const fn of this.handlers) {
      try { fn(e); } catch (err) { console.error('event handler', err); }
    }
  }
}
