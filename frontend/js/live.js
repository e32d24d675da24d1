// The live websocket (/ws/live): JSON frames in, reconnect with backoff when it drops.
//
// onOpen(reconnected) fires on every successful connection; `reconnected` is true after a
// drop, which is when a page refetches over REST what it missed. A close with code 1013
// means the server dropped us for falling behind: we reconnect at once and catch up.

const MIN_DELAY_MS = 500;
const MAX_DELAY_MS = 15000;
const STABLE_MS = 5000; // connected this long: the next drop starts the backoff afresh

export class LiveSocket {
  /**
   * @param {string} url
   * @param {{onMessage: (msg: object) => void, onOpen?: (reconnected: boolean) => void,
   *          onStatus?: (status: "connecting"|"live"|"reconnecting", retryInMs?: number) => void}} handlers
   */
  constructor(url, { onMessage, onOpen = () => {}, onStatus = () => {} }) {
    this.url = url;
    this.onMessage = onMessage;
    this.onOpen = onOpen;
    this.onStatus = onStatus;
    this.attempt = 0;
    this.everOpened = false;
    this.stopped = false;
    this.ws = null;
    this.retryTimer = null;
    this.stableTimer = null;
  }

  start() {
    this.stopped = false;
    this.connect();
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    clearTimeout(this.stableTimer);
    if (this.ws) this.ws.close(1000);
    this.ws = null;
  }

  connect() {
    this.onStatus("connecting");
    let ws;
    try {
      ws = new WebSocket(this.url);
    } catch (err) {
      this.scheduleRetry();
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      const reconnected = this.everOpened;
      this.everOpened = true;
      this.onStatus("live");
      this.stableTimer = setTimeout(() => { this.attempt = 0; }, STABLE_MS);
      this.onOpen(reconnected);
    };
    ws.onmessage = (ev) => {
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        console.warn("gradwatch: ignoring a live frame that is not JSON");
        return;
      }
      this.onMessage(msg);
    };
    ws.onclose = (ev) => {
      clearTimeout(this.stableTimer);
      if (this.ws !== ws) return; // an old socket
      this.ws = null;
      if (this.stopped) return;
      if (ev.code === 1013) this.attempt = 0; // fell behind: catch up now
      this.scheduleRetry(ev.code === 1013 ? 0 : undefined);
    };
    ws.onerror = () => { /* onclose follows and schedules the retry */ };
  }

  scheduleRetry(delayMs) {
    const base = Math.min(MAX_DELAY_MS, MIN_DELAY_MS * 2 ** this.attempt);
    const delay = delayMs ?? Math.round(base * (0.8 + 0.4 * Math.random()));
    this.attempt += 1;
    this.onStatus("reconnecting", delay);
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }
}

/** Render a LiveSocket status into a small indicator element (a dot and a word). */
export function renderLiveStatus(el, status, retryInMs) {
  el.dataset.live = status;
  const text = {
    connecting: "Connecting…",
    live: "Live",
    reconnecting: retryInMs > 1500 ? `Reconnecting in ${Math.round(retryInMs / 1000)}s` : "Reconnecting…",
    offline: "Offline",
  }[status] || status;
  el.textContent = text;
  el.title = status === "live" ? "Receiving live updates from the server" : "Live updates paused; the page reconnects by itself";
}
