/**
 * The chat page of `k3 serve` (cli/web/, docs/web.md): `GET /` answers the page and
 * `GET /web/NAME` its scripts and style. The files are imported as text, so the checkout,
 * the bundle (dist/k3.js) and the compiled binary all carry them with the code; nothing is
 * read from disk or fetched from elsewhere at run time.
 *
 * Every answer carries a Content-Security-Policy that lets the page load only its own
 * files and talk only to its own origin, and forbids framing it (another site cannot put
 * the page in a frame and click on it).
 *
 * @module
 */

import indexHtml from "../web/index.html" with { type: "text" };
import appJs from "../web/app.js" with { type: "text" };
import markdownJs from "../web/markdown.js" with { type: "text" };
import panelJs from "../web/panel.js" with { type: "text" };
import sseJs from "../web/sse.js" with { type: "text" };
import styleCss from "../web/style.css" with { type: "text" };
import { ApiError } from "../openai_error.ts";

/** The page's files by the path they are served at, with their content types. */
export const WEB_ASSETS: ReadonlyMap<string, { body: string; type: string }> = new Map([
  ["/", { body: indexHtml, type: "text/html; charset=utf-8" }],
  ["/web/app.js", { body: appJs, type: "text/javascript; charset=utf-8" }],
  ["/web/markdown.js", { body: markdownJs, type: "text/javascript; charset=utf-8" }],
  ["/web/panel.js", { body: panelJs, type: "text/javascript; charset=utf-8" }],
  ["/web/sse.js", { body: sseJs, type: "text/javascript; charset=utf-8" }],
  ["/web/style.css", { body: styleCss, type: "text/css; charset=utf-8" }],
]);

/** Headers of every page answer: its own files only, its own origin only, never framed. */
export const PAGE_HEADERS: Readonly<Record<string, string>> = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  "x-frame-options": "DENY",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cache-control": "no-cache",
};

/** True when `path` is one of the page's. */
export function isWebPath(path: string): boolean {
  return path === "/" || path.startsWith("/web/");
}

/** The answer to a GET or HEAD of the page's `path` (404 for a name it does not have). */
export function webAsset(req: Request, path: string): Response {
  const asset = WEB_ASSETS.get(path);
  if (!asset) throw new ApiError(404, `no page file ${path.slice(0, 100)}`, null, "not_found");
  return new Response(req.method === "HEAD" ? null : asset.body, {
    headers: { "content-type": asset.type, ...PAGE_HEADERS },
  });
}
