// Small progressive enhancements; every page works without them.
document.addEventListener("DOMContentLoaded", () => {
  // The switchers submit on change; their button stays for keyboard users without script.
  for (const form of document.querySelectorAll("form[data-autosubmit]")) {
    for (const el of form.querySelectorAll(".js-hide")) el.hidden = true;
    for (const select of form.querySelectorAll("select")) select.addEventListener("change", () => form.submit());
  }
  // Forms that ask before a destructive action: <form data-confirm="Cancel this reservation?">.
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => { if (!window.confirm(form.dataset.confirm)) event.preventDefault(); });
  }
});
// Notes true only where this script runs (a page's "updating live") are hidden in the HTML and shown
// here, in the page and in whatever htmx swaps in later.
if (window.htmx) {
  htmx.onLoad((root) => {
    for (const el of root.querySelectorAll("[data-script-only]")) el.hidden = false;
  });
}
