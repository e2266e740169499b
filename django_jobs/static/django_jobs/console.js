/* django-jobs console: the copy button of a new API token's page (shown once). */
"use strict";
(function () {
  function copied(button, text) {
    var note = document.getElementById(button.dataset.note);
    if (note) { note.textContent = text; }
  }
  function fallback(source) {
    var range = document.createRange();
    range.selectNodeContents(source);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    try { return document.execCommand("copy"); } catch (error) { return false; }
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) { return; }
    var source = document.getElementById(button.dataset.copy);
    if (!source) { return; }
    var text = source.textContent.trim();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { copied(button, "Copied."); },
        function () { copied(button, fallback(source) ? "Copied." : "Select it and copy it."); }
      );
    } else {
      copied(button, fallback(source) ? "Copied." : "Select it and copy it.");
    }
  });
})();
