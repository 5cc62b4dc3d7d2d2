// Small progressive enhancements; every page works without them.
document.addEventListener("DOMContentLoaded", () => {
  // The switchers submit when a pointer picks an option. A keyboard only picks (arrow keys walk
  // the options, and each step fires "change"): its user presses Switch (WCAG 3.2.2, On Input).
  for (const form of document.querySelectorAll("form[data-autosubmit]")) {
    for (const select of form.querySelectorAll("select")) {
      let byKey = false;
      select.addEventListener("keydown", () => { byKey = true; });
      select.addEventListener("pointerdown", () => { byKey = false; });
      select.addEventListener("change", () => { if (!byKey) form.submit(); });
    }
  }
  // On a phone the navigation is one line that scrolls sideways: the current page's link in view.
  const current = document.querySelector("nav.side [aria-current=page]");
  const side = current && current.closest("nav.side");
  if (side && side.scrollWidth > side.clientWidth) {
    side.scrollLeft = current.offsetLeft - (side.clientWidth - current.offsetWidth) / 2;
  }
  // Copy buttons beside what one pastes elsewhere: <code data-copy> (an SSH command, an address)
  // or <input data-copy> (a new token). Without the script the text is there to select.
  if (navigator.clipboard) {
    for (const source of document.querySelectorAll("[data-copy]")) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "copy-button";
      button.textContent = "Copy";
      button.setAttribute("aria-label", `Copy ${source.dataset.copy || "this"}`);
      button.addEventListener("click", async () => {
        const text = source.value !== undefined ? source.value : source.textContent;
        try {
          await navigator.clipboard.writeText(text.trim());
          button.textContent = "Copied";
        } catch {
          button.textContent = "Select and copy";
        }
        setTimeout(() => { button.textContent = "Copy"; }, 2000);
      });
      source.after(button);
    }
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
