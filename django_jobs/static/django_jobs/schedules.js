// A schedule's form reads its cron expression and time zone as they are typed: "When it runs"
// shows their words and next runs, or what is wrong with them, from the admin's preview page
// (the box's data-dj-preview), a moment after the last key. Nothing is saved until the form is.
(function () {
  "use strict";

  function start() {
    const box = document.querySelector("[data-dj-preview]");
    const cron = document.getElementById("id_cron");
    const zone = document.getElementById("id_timezone");
    if (!box || !cron || !zone) {
      return;
    }
    let timer = null;
    let pending = null;

    function refresh() {
      if (pending) {
        pending.abort();
      }
      pending = new AbortController();
      const query = new URLSearchParams({ cron: cron.value, timezone: zone.value });
      fetch(box.dataset.djPreview + "?" + query.toString(), {
        credentials: "same-origin",
        signal: pending.signal,
      })
        .then((response) => (response.ok ? response.text() : null))
        .then((html) => {
          if (html !== null) {
            box.innerHTML = html; // rendered and escaped by the server's template
          }
        })
        .catch(() => {}); // superseded by a later key, or offline: the box keeps what it had
    }

    function soon() {
      clearTimeout(timer);
      timer = setTimeout(refresh, 300);
    }

    for (const field of [cron, zone]) {
      field.addEventListener("input", soon);
      field.addEventListener("change", soon);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
