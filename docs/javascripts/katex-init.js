// Render the formulas marked by pymdownx.arithmatex (generic mode): inline \( ... \) in a
// span, display \[ ... \] in a div, each with class "arithmatex". KaTeX ships with the site
// (docs/javascripts/katex/), so nothing is fetched from a CDN.
function renderMath(root) {
  root.querySelectorAll(".arithmatex").forEach((el) => {
    if (el.dataset.rendered) return;
    const tex = el.textContent.trim();
    const display = tex.startsWith("\\[");
    const body = tex.replace(/^\\[([]/, "").replace(/\\[)\]]$/, "");
    katex.render(body, el, { displayMode: display, throwOnError: false });
    el.dataset.rendered = "1";
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(({ body }) => renderMath(body));   // Material's page-load observable
} else {
  document.addEventListener("DOMContentLoaded", () => renderMath(document.body));
}
