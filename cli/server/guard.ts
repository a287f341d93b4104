/**
 * What `k3 serve` checks before anything else, so that a web page cannot use a server on
 * loopback: the `Host` header must name the listening address (DNS rebinding), a POST
 * from another origin is refused unless `--cors` allows that origin, and a JSON endpoint
 * refuses the body types a browser may send cross-origin without a preflight. Also the
 * CORS answers, and the one place request text is made safe for a log line.
 *
 * @module
 */

import { ApiError } from "../openai_error.ts";

/** How the browser checks are set up. */
export interface GuardOptions {
  /** The address listened on, as given. */
  hostname: string;
  /** The port listened on. */
  port: number;
  /** True when `--host` was given: any Host is accepted unless `allowedHosts` is set. */
  hostExplicit: boolean;
  /** Host names (without port) accepted besides the listening address. */
  allowedHosts: string[];
  /** The origin `--cors` allows ("*" for any), or undefined. */
  cors?: string;
}

const LOOPBACK_NAMES = ["127.0.0.1", "localhost", "::1", "[::1]"];

/** The host part of a Host header value, lowercased, brackets kept for IPv6. */
function hostName(value: string): string {
  const v = value.trim().toLowerCase();
  if (v.startsWith("[")) return v.slice(0, v.indexOf("]") + 1);
  const colon = v.lastIndexOf(":");
  return colon >= 0 ? v.slice(0, colon) : v;
}

/** Host names a request may name for these options (undefined: any). */
export function acceptedHosts(o: GuardOptions): Set<string> | undefined {
  if (o.hostExplicit && o.allowedHosts.length === 0) return undefined;
  const own = o.hostname.includes(":") && !o.hostname.startsWith("[") ? `[${o.hostname}]` : o.hostname;
  const names = new Set([own.toLowerCase(), ...o.allowedHosts.map((h) => h.toLowerCase())]);
  if (LOOPBACK_NAMES.includes(o.hostname) || o.hostname === "0.0.0.0") { for (const n of LOOPBACK_NAMES) names.add(n); }
  return names;
}

/** Throws 421 when the Host header names another server (DNS rebinding). */
export function checkHost(req: Request, accepted: Set<string> | undefined): void {
  if (!accepted) return;
  const host = req.headers.get("host");
  if (host === null || !accepted.has(hostName(host))) {
    throw new ApiError(
      421,
      "this server does not answer for that Host (start it with --allowed-host NAME to allow one)",
      null,
      "misdirected_request",
    );
  }
}

/**
 * Throws 403 for a cross-origin POST `--cors` does not allow, 415 for a body that is not
 * typed as JSON (as OpenAI answers; a body type a browser could send without a preflight
 * among them).
 */
export function checkOrigin(req: Request, o: GuardOptions): void {
  if (req.method !== "POST") return;
  const type = (req.headers.get("content-type") ?? "").split(";")[0].trim().toLowerCase();
  // The body types a browser sends cross-origin without a preflight are never JSON, so this
  // also keeps pages from starting generations.
  if (type !== "application/json" && !/^application\/[a-z0-9.+-]*\+json$/.test(type)) {
    throw new ApiError(
      415,
      `the body must be application/json, not ${type === "" ? "untyped" : logSafe(type, 60)}`,
      null,
      "unsupported_media_type",
    );
  }
  checkSameOrigin(req, o);
}

/**
 * Throws 403 for a request another origin's page sent (its `Origin`, or `Sec-Fetch-Site`
 * cross-site or same-site) unless `--cors` allows that origin. POSTs are checked this way,
 * and so is the status stream, whatever its method.
 */
export function checkSameOrigin(req: Request, o: GuardOptions): void {
  const origin = req.headers.get("origin");
  const site = req.headers.get("sec-fetch-site");
  if (origin === null && (site === null || site === "same-origin" || site === "none")) return;
  if (o.cors === "*" || (origin !== null && o.cors === origin)) return;
  if (origin !== null && origin !== "null") {
    const host = req.headers.get("host") ?? "";
    try {
      if (new URL(origin).host === host.toLowerCase() && site !== "cross-site" && site !== "same-site") return;
    } catch { /* not a URL: refused below */ }
  } else if (site === "same-origin" || site === "none") return;
  throw new ApiError(
    403,
    "cross-origin requests are refused (start the server with --cors ORIGIN to allow one)",
    null,
    "cross_origin",
  );
}

/** Request headers the official SDKs send, allowed in a CORS preflight. */
const SDK_HEADER = /^(authorization|content-type|accept|user-agent|openai-[a-z-]{1,40}|x-stainless-[a-z-]{1,40})$/;

/** CORS headers for a response to `req` (none without `--cors` or for another origin). */
export function corsHeaders(req: Request, cors: string | undefined): Record<string, string> {
  if (!cors) return {};
  const origin = req.headers.get("origin");
  if (cors !== "*" && origin !== cors) return { vary: "origin" };
  const out: Record<string, string> = {
    "access-control-allow-origin": cors,
    "access-control-allow-methods": "GET, POST, OPTIONS",
    "access-control-max-age": "600",
    vary: "origin",
  };
  if (req.method === "OPTIONS") {
    const asked = (req.headers.get("access-control-request-headers") ?? "").toLowerCase().split(",")
      .map((h) => h.trim()).filter((h) => SDK_HEADER.test(h));
    out["access-control-allow-headers"] = [...new Set(["authorization", "content-type", ...asked])].join(", ");
  }
  return out;
}

/** `text` for a log line: at most `max` characters, control and non-ASCII escaped. */
export function logSafe(text: string, max = 200): string {
  const cut = text.length > max ? text.slice(0, max) : text;
  const esc = cut.replace(/[^\x21-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  return text.length > max ? `${esc}...(${text.length} chars)` : esc;
}
