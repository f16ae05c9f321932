// The console's script: times in the viewer's zone, and live pages. Every
// page works without it; it never builds HTML from data, it only swaps in
// the <main> the server rendered (and escaped) again.
"use strict";

function localTimes(root) {
  for (const el of root.querySelectorAll("time[datetime]")) {
    const when = new Date(el.getAttribute("datetime"));
    if (!Number.isNaN(when.getTime())) {
      el.textContent = when.toLocaleString();
      el.title = el.getAttribute("datetime");
    }
  }
}

// True while the person is writing in a form of the page: a refresh then
// would lose what they typed.
function busy(main) {
  const active = document.activeElement;
  if (active && main.contains(active) && active.matches("input, textarea, select")) {
    return true;
  }
  for (const field of main.querySelectorAll("textarea, input[type=text], input:not([type])")) {
    if (field.value) return true;
  }
  return false;
}

async function refresh() {
  const main = document.getElementById("main");
  if (!main || busy(main)) return;
  const answer = await fetch(location.href, { credentials: "same-origin" });
  // The session ended: the whole page goes to the sign-in page.
  if (answer.redirected && new URL(answer.url).pathname === "/console/login") {
    location.assign(answer.url);
    return;
  }
  if (!answer.ok) return;
  const page = new DOMParser().parseFromString(await answer.text(), "text/html");
  const fresh = page.getElementById("main");
  if (fresh) {
    main.replaceWith(fresh);
    localTimes(fresh);
  }
}

function live() {
  const main = document.getElementById("main");
  if (!main || !main.dataset.live || !window.EventSource) return;
  let pending = null;
  const events = new EventSource("/console/events");
  events.onmessage = () => {
    clearTimeout(pending);
    pending = setTimeout(refresh, 250);
  };
  ["job", "ticket", "run"].forEach((kind) =>
    events.addEventListener(kind, () => {
      clearTimeout(pending);
      pending = setTimeout(refresh, 250);
    }),
  );
}

// A notice of the action that led here is shown once: the address loses
// it, so a refresh does not repeat it.
function forgetNotice() {
  const url = new URL(location.href);
  if (["done", "error", "sig"].some((key) => url.searchParams.has(key))) {
    ["done", "error", "sig"].forEach((key) => url.searchParams.delete(key));
    history.replaceState(null, "", url);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  forgetNotice();
  live();
});
