// Plug it into existing tools: the snippets are rendered by the server (filled in for this
// server); this adds a "Copy" button to each.
import { el } from "../console.js";

export async function init(root) {
  for (const code of root.querySelectorAll("code[data-snippet]")) {
    const pre = code.closest("pre");
    const name = code.dataset.snippet;
    const status = el("span", { class: "muted", role: "status", "aria-live": "polite" });
    const button = el(
      "button",
      {
        type: "button",
        class: "secondary",
        "aria-label": `Copy the ${name} snippet`,
        onclick: async () => {
          try {
            await navigator.clipboard.writeText(code.textContent);
            status.textContent = "copied";
          } catch {
            // No clipboard (a page not on https or localhost): select the text instead.
            const range = document.createRange();
            range.selectNodeContents(code);
            const selection = window.getSelection();
            selection.removeAllRanges();
            selection.addRange(range);
            status.textContent = "selected: press Ctrl+C";
          }
          setTimeout(() => (status.textContent = ""), 3000);
        },
      },
      "Copy"
    );
    pre.before(el("div", { class: "snippet-tools" }, button, " ", status));
  }
}
