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
  for (const field of main.querySelectorAll("textarea, input[type=text]")) {
    if (field.value) return true;
  }
  return false;
}

async function refresh() {
  const main = document.getElementById("main");
  if (!main || busy(main)) return;
  const answer = await fetch(location.href, { credentials: "same-origin" });
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

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  live();
});
