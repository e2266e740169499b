/* django-jobs admin: the job list's optional auto-refresh, and the live log that follows its
   newest line. No framework: loaded through JobAdmin's Media. */
(function () {
  "use strict";
  var KEY = "django-jobs.refresh";

  function follow() {
    document.querySelectorAll("pre.dj-follow").forEach(function (pre) {
      pre.scrollTop = pre.scrollHeight;
    });
  }

  function selectedRows() {
    return document.querySelectorAll("#result_list input.action-select:checked").length > 0;
  }

  function autoRefresh() {
    var select = document.getElementById("dj-refresh");
    if (!select) return;
    var timer = null;
    var saved = "0";
    try { saved = window.localStorage.getItem(KEY) || "0"; } catch (e) { /* private mode */ }
    if (select.querySelector('option[value="' + saved + '"]')) select.value = saved;

    function schedule() {
      if (timer) window.clearTimeout(timer);
      timer = null;
      var seconds = parseInt(select.value, 10);
      if (!seconds) return;
      timer = window.setTimeout(function () {
        // Paused while the tab is hidden or rows are selected for an action.
        if (document.visibilityState === "hidden" || selectedRows()) { schedule(); return; }
        window.location.reload();
      }, seconds * 1000);
    }

    select.addEventListener("change", function () {
      try { window.localStorage.setItem(KEY, select.value); } catch (e) { /* private mode */ }
      schedule();
    });
    document.addEventListener("visibilitychange", function () {
      if (document.visibilityState === "visible") schedule();
    });
    schedule();
  }

  function start() { follow(); autoRefresh(); }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
