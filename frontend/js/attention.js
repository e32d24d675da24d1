// Findings that reach the person: a run page in a background tab shows the run's finding count in
// its title ("(2) lr3e-4 · gradwatch": a new finding changes the tab's name), and, when the
// person asked for it, each new error or warning shows a desktop notification. Notifications are
// off until turned on with the page's toggle: the browser's permission is asked then, once, and
// the choice is kept in localStorage. A click on a notification brings the tab forward.

const PREF_KEY = "gradwatch.notify";
const NOTIFY = new Set(["error", "warning"]);

/** Whether desktop notifications are on (the person turned them on and the browser allows them). */
export function notificationsOn() {
  try {
    return localStorage.getItem(PREF_KEY) === "1" && "Notification" in window && Notification.permission === "granted";
  } catch { return false; }
}

/**
 * Turn desktop notifications on or off; turning on asks the browser's permission if it was never
 * given (once: a refusal is the browser's answer until the person changes it there). Resolves to
 * whether they are on.
 */
export async function setNotifications(on) {
  try {
    if (!on) {
      localStorage.setItem(PREF_KEY, "0");
      return false;
    }
    if (!("Notification" in window)) return false;
    const permission = Notification.permission === "default" ? await Notification.requestPermission() : Notification.permission;
    localStorage.setItem(PREF_KEY, permission === "granted" ? "1" : "0");
    return permission === "granted";
  } catch { return false; }
}

/**
 * Follow a run's findings for the title and notifications.
 * @param {() => string} baseTitle  the page title without the count
 */
export function findingAlerts(baseTitle) {
  let seen = null;   // code:severity of the findings notified or known at load; null before the first list
  let count = 0;     // the run's findings

  const title = () => {
    document.title = document.hidden && count ? `(${count}) ${baseTitle()}` : baseTitle();
  };
  document.addEventListener("visibilitychange", title);

  return {
    /** Put the count back in the title after the page rewrote it. */
    title,
    /**
     * The run's findings now (the panel's whole list, after a load or a live change): the count
     * for the title; a notification for each new error or warning (or one turned graver).
     */
    update(list, runName, page = location.href) {
      count = list.length;
      title();
      const keys = new Map(list.map((f) => [`${f.code}:${f.severity}`, f]));
      if (seen === null) {
        seen = new Set(keys.keys()); // what the page opened with is not news
        return;
      }
      const fresh = [...keys].filter(([k]) => !seen.has(k)).map(([, f]) => f);
      for (const k of keys.keys()) seen.add(k);
      if (!fresh.length || !notificationsOn()) return;
      for (const f of fresh.filter((x) => NOTIFY.has(x.severity))) {
        const n = new Notification(`gradwatch ${f.severity}: ${runName}`, { body: String(f.message || f.code), tag: `${page}#${f.code}` });
        n.onclick = () => { window.focus(); n.close(); };
      }
    },
  };
}

/** The header's bell: desktop notifications for new errors and warnings, off until pressed. */
export function notificationToggle() {
  const supported = "Notification" in window;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "btn btn-toggle";
  button.dataset.notify = "";
  button.hidden = !supported;
  const show = (on) => {
    button.setAttribute("aria-pressed", String(on));
    button.textContent = on ? "Notifying: on" : "Notify me";
    button.title = on ? "Desktop notifications for new errors and warnings are on; press to turn them off"
      : "Show a desktop notification when this run gets a new error or warning";
  };
  show(notificationsOn());
  button.addEventListener("click", async () => {
    const on = await setNotifications(button.getAttribute("aria-pressed") !== "true");
    show(on);
    if (!on && supported && Notification.permission === "denied") button.title = "Notifications are blocked for this site in the browser's settings";
  });
  return button;
}
