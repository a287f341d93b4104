/**
 * The chat page of `k3 serve` (cli/web/, docs/web.md): `GET /` answers the page and
 * `GET /web/NAME` its scripts and style. The files are read once, on the first request:
 * from the bundle's embedded copy (dist/k3.js carries them as text, engine/native/embedded.ts),
 * else from cli/web/ beside this module (a checkout, or the compiled binary, which includes
 * them: cli/compile.ts). Nothing is fetched from elsewhere. (Not `import ... with { type:
 * "text" }`: `deno doc --lint`, part of CI, cannot resolve such imports.)
 *
 * Every answer carries a Content-Security-Policy that lets the page load only its own
 * files and talk only to its own origin, and forbids framing it (another site cannot put
 * the page in a frame and click on it).
 *
 * @module
 */

import { EMBEDDED } from "../../engine/native/embedded.ts";
import { ApiError } from "../openai_error.ts";

/** The chat page's files in cli/web/ (the compiled binary includes them, the bundle embeds
 * them: cli/compile.ts, cli/bundle.ts). */
export const WEB_FILES = ["index.html", "app.js", "markdown.js", "panel.js", "sse.js", "style.css"];

/** Content types by file ending. */
const TYPES: Record<string, string> = {
  html: "text/html; charset=utf-8",
  js: "text/javascript; charset=utf-8",
  css: "text/css; charset=utf-8",
};

let assets: ReadonlyMap<string, { body: string; type: string }> | undefined;

/** The page's files by the path they are served at (`/` for index.html, else `/web/NAME`),
 * with their content types; read once. */
export function webAssets(): ReadonlyMap<string, { body: string; type: string }> {
  assets ??= new Map(WEB_FILES.map((name) => {
    const body = EMBEDDED.web.get(name) ?? Deno.readTextFileSync(new URL(`../web/${name}`, import.meta.url));
    return [name === "index.html" ? "/" : `/web/${name}`, { body, type: TYPES[name.split(".").pop()!] }];
  }));
  return assets;
}

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
  const asset = webAssets().get(path);
  if (!asset) throw new ApiError(404, `no page file ${path.slice(0, 100)}`, null, "not_found");
  return new Response(req.method === "HEAD" ? null : asset.body, {
    headers: { "content-type": asset.type, ...PAGE_HEADERS },
  });
}
