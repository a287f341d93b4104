// A small Markdown renderer for model replies: every character of the text is HTML-escaped
// first, and only then are the few constructs below turned into tags, so nothing the model
// writes can become markup of its own. Fenced code blocks, inline code, **strong**, *em*,
// links whose target is http(s) (others stay text), bullet and numbered lists, paragraphs.
// An unclosed fence (a reply still streaming) renders as a code block to the end.

/** `text` with &, <, >, " and ' escaped. */
export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** Inline constructs of one escaped line: code spans first (their content stays as is). */
function inline(escaped) {
  const parts = escaped.split(/(`[^`]+`)/);
  return parts.map((part, i) => {
    if (i % 2 === 1) return `<code>${part.slice(1, -1)}</code>`;
    return part
      .replace(
        /\[([^\]]+)\]\((https?:\/\/[^\s()]+)\)/g,
        (_, label, url) => `<a href="${url}" rel="noopener noreferrer nofollow" target="_blank">${label}</a>`,
      )
      .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^*\w])\*([^*\s][^*]*)\*(?!\w)/g, "$1<em>$2</em>");
  }).join("");
}

/** HTML for `markdown` (see the module comment for what is rendered). */
export function renderMarkdown(markdown) {
  const lines = escapeHtml(markdown).split("\n");
  const out = [];
  let paragraph = [];
  let list = null; // { tag: "ul" | "ol", items: string[] }
  const flush = () => {
    if (paragraph.length > 0) out.push(`<p>${paragraph.map(inline).join("<br>")}</p>`);
    paragraph = [];
    if (list) out.push(`<${list.tag}>${list.items.map((it) => `<li>${inline(it)}</li>`).join("")}</${list.tag}>`);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = /^\s*```\s*([\w+-]*)\s*$/.exec(line);
    if (fence) {
      flush();
      const code = [];
      for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) code.push(lines[i]);
      const lang = fence[1] ? ` data-lang="${fence[1]}"` : "";
      out.push(`<pre${lang}><code>${code.join("\n")}</code></pre>`);
      continue;
    }
    const item = /^\s*(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/.exec(line);
    if (item) {
      const tag = item[1] ? "ul" : "ol";
      if (paragraph.length > 0 || (list && list.tag !== tag)) flush();
      list ??= { tag, items: [] };
      list.items.push(item[3]);
      continue;
    }
    if (line.trim() === "") {
      flush();
      continue;
    }
    if (list) flush();
    paragraph.push(line);
  }
  flush();
  return out.join("");
}
