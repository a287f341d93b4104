/**
 * The Hugging Face Hub's protocol, as `k3 pull` speaks it: the file list of one revision
 * (`GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true`: every file's size, git
 * blob id, and for LFS files the SHA-256 of the content), and each file's content at
 * `{endpoint}/{repo}/resolve/{commit}/{path}`, which answers with the bytes or redirects to
 * a CDN. `HF_ENDPOINT` names a mirror; `HF_TOKEN` is sent as a Bearer token to the hub (and
 * never to a host it redirects to). 401/403/404 end with one line; 429 and 5xx are retried
 * after the server's `Retry-After` (or a growing pause).
 *
 * @module
 */

import { EXIT, K3Error } from "../../engine/errors.ts";
import { fmtDuration } from "../progress.ts";

/** The public hub, when HF_ENDPOINT is not set. */
export const DEFAULT_ENDPOINT = "https://huggingface.co";

/** One file of a revision, as the hub lists it. */
export interface HubFile {
  /** Path inside the repository (`model-00001-of-00096.safetensors`, `docs/x.png`). */
  path: string;
  /** Size in bytes. */
  size: number;
  /** SHA-256 of the content (hex), for LFS files. */
  sha256?: string;
  /** Git blob id (SHA-1 of `blob SIZE\0` + content, hex), for every file. */
  blobId?: string;
}

/** A revision's files, pinned to the commit the hub resolved the revision to. */
export interface HubListing {
  /** The commit id (the revision resolved), used in every file URL. */
  commit: string;
  /** Every file of the revision. */
  files: HubFile[];
}

/** Where and how to reach the hub. */
export interface HubClient {
  /** Base URL without a trailing slash. */
  endpoint: string;
  /** Bearer token, if any. */
  token?: string;
  /** Attempts per request before a retryable failure is final. */
  attempts: number;
  /** Prints a one-line note (a retry, a wait). */
  note: (line: string) => void;
  /** Waits `ms` milliseconds (injectable so tests of the policy need no clock). */
  sleep: (ms: number) => Promise<void>;
}

/** An environment variable k3 may not be allowed to read counts as unset. */
function envVar(name: string): string | undefined {
  try {
    const v = Deno.env.get(name);
    return v === undefined || v === "" ? undefined : v;
  } catch {
    return undefined;
  }
}

/** The client from the environment: HF_ENDPOINT (default the public hub) and HF_TOKEN. */
export function hubFromEnv(note: (line: string) => void): HubClient {
  const endpoint = (envVar("HF_ENDPOINT") ?? DEFAULT_ENDPOINT).replace(/\/+$/, "");
  if (!/^https?:\/\//.test(endpoint)) {
    throw new K3Error(`pull: HF_ENDPOINT=${endpoint}: expected an http:// or https:// URL`, EXIT.usage);
  }
  return {
    endpoint,
    token: envVar("HF_TOKEN"),
    attempts: 6,
    note,
    sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
  };
}

/** `owner/name`, the only repository form the hub's model URLs take. */
export function checkRepo(repo: string): void {
  if (!/^[A-Za-z0-9][\w.-]*\/[\w.-]+$/.test(repo) || repo.includes("..")) {
    throw new K3Error(
      `pull: ${JSON.stringify(repo)} is not a repository id; expected OWNER/NAME (e.g. moonshotai/Kimi-K3)`,
      EXIT.usage,
    );
  }
}

/** Seconds to wait from a Retry-After header (seconds or an HTTP date), if it has one. */
export function retryAfterSeconds(header: string | null, now = Date.now()): number | undefined {
  if (header === null) return undefined;
  if (/^\d+$/.test(header.trim())) return Number(header.trim());
  const at = Date.parse(header);
  return Number.isNaN(at) ? undefined : Math.max(0, (at - now) / 1000);
}

/** A failed request the caller should not retry: the one line to print. */
function refusal(status: number, what: string, hub: HubClient): K3Error {
  const token = hub.token ? "HF_TOKEN is set but" : "HF_TOKEN is not set and";
  switch (status) {
    case 401:
      return new K3Error(
        `pull: ${what}: the hub refused access (401): ${token} the repository needs a token that can read it`,
      );
    case 403:
      return new K3Error(
        `pull: ${what}: access denied (403): accept the model's terms on its page, or use a token with access (HF_TOKEN)`,
      );
    case 404:
      return new K3Error(
        `pull: ${what}: not found (404): check the repository id and --revision (a private repository needs HF_TOKEN)`,
      );
    default:
      return new K3Error(`pull: ${what}: the hub answered ${status}`);
  }
}

/** Statuses worth another try: rate limits and the server's own failures. */
function retryable(status: number): boolean {
  return status === 429 || status === 408 || status >= 500;
}

/** The pause before attempt `n` (1-based) when the server names none: 1, 2, 4, ... 30 s. */
function backoffSeconds(n: number): number {
  return Math.min(30, 2 ** (n - 1));
}

/**
 * GET `url` with the token (to the hub's own origin only), following redirects by hand so
 * the token never reaches the CDN; retries 429/5xx and network failures. Returns the final
 * response (2xx, or 416 for a range already complete); any other status ends with one line.
 */
export async function hubGet(
  hub: HubClient,
  url: string,
  what: string,
  headers: Record<string, string> = {},
): Promise<Response> {
  const hubOrigin = new URL(hub.endpoint).origin;
  for (let attempt = 1;; attempt++) {
    let wait: number | undefined;
    let why: string;
    try {
      let target = url;
      for (let hop = 0;; hop++) {
        const h: Record<string, string> = { ...headers, "user-agent": "k3-pull" };
        if (hub.token && new URL(target).origin === hubOrigin) h.authorization = `Bearer ${hub.token}`;
        const res = await fetch(target, { headers: h, redirect: "manual" });
        const location = res.headers.get("location");
        if (res.status >= 300 && res.status < 400 && location) {
          await res.body?.cancel();
          if (hop >= 10) throw new K3Error(`pull: ${what}: more than 10 redirects`);
          target = new URL(location, target).href;
          continue;
        }
        if (res.ok || res.status === 416) return res;
        await res.body?.cancel();
        if (!retryable(res.status)) throw refusal(res.status, what, hub);
        wait = retryAfterSeconds(res.headers.get("retry-after"));
        why = res.status === 429 ? "rate limited (429)" : `the server answered ${res.status}`;
        break;
      }
    } catch (e) {
      if (e instanceof K3Error) throw e;
      why = `network error: ${(e as Error).message}`;
    }
    if (attempt >= hub.attempts) throw new K3Error(`pull: ${what}: ${why!}; gave up after ${attempt} attempts`);
    const seconds = wait ?? backoffSeconds(attempt);
    hub.note(`pull: ${what}: ${why!}; retrying in ${fmtDuration(seconds)}`);
    await hub.sleep(seconds * 1000);
  }
}

/** Encodes a repository path for a URL, keeping its slashes. */
function encodePath(path: string): string {
  return path.split("/").map(encodeURIComponent).join("/");
}

/** The URL of one file's content at a commit. */
export function resolveUrl(hub: HubClient, repo: string, commit: string, path: string): string {
  return `${hub.endpoint}/${repo}/resolve/${encodeURIComponent(commit)}/${encodePath(path)}`;
}

/** The files of `repo` at `revision` (a branch, tag or commit), pinned to its commit. */
export async function listRevision(hub: HubClient, repo: string, revision: string): Promise<HubListing> {
  const url = `${hub.endpoint}/api/models/${repo}/revision/${encodeURIComponent(revision)}?blobs=true`;
  const res = await hubGet(hub, url, `${repo}@${revision}`);
  let body: any;
  try {
    body = await res.json();
  } catch (e) {
    throw new K3Error(`pull: ${repo}@${revision}: the hub's file list is not JSON (${(e as Error).message})`);
  }
  const siblings = body?.siblings;
  if (typeof body?.sha !== "string" || !Array.isArray(siblings)) {
    throw new K3Error(`pull: ${repo}@${revision}: the hub's answer has no commit (sha) or file list (siblings)`);
  }
  const files: HubFile[] = [];
  for (const s of siblings) {
    const path = s?.rfilename;
    const size = s?.lfs?.size ?? s?.size;
    if (typeof path !== "string" || !Number.isSafeInteger(size) || size < 0) {
      throw new K3Error(`pull: ${repo}@${revision}: a listed file has no name or size (was ?blobs=true honoured?)`);
    }
    // A path that would leave the target directory is the hub's error, never followed.
    if (path.startsWith("/") || path.split("/").some((p: string) => p === ".." || p === "")) {
      throw new K3Error(`pull: ${repo}@${revision}: refusing the listed path ${JSON.stringify(path)}`);
    }
    const sha256 = typeof s?.lfs?.sha256 === "string" ? s.lfs.sha256.toLowerCase() : undefined;
    const blobId = typeof s?.blobId === "string" ? s.blobId.toLowerCase() : undefined;
    files.push({ path, size, sha256, blobId });
  }
  return { commit: body.sha, files };
}

/**
 * Bytes [start, start + length) of the file at `url` (a ranged GET; a server that ignores
 * the Range and sends the whole file is read only as far as needed). Fewer bytes come back
 * only when the file ends first.
 */
export async function fetchBytes(
  hub: HubClient,
  url: string,
  what: string,
  start: number,
  length: number,
): Promise<Uint8Array> {
  const res = await hubGet(hub, url, what, {
    "accept-encoding": "identity",
    range: `bytes=${start}-${start + length - 1}`,
  });
  if (res.status === 416) return new Uint8Array(0);
  let skip = res.status === 206 ? start - Number(res.headers.get("content-range")?.match(/^bytes (\d+)-/)?.[1]) : start;
  if (!(skip >= 0)) {
    await res.body?.cancel();
    throw new K3Error(`pull: ${what}: the server answered a range that does not start at byte ${start}`);
  }
  const out = new Uint8Array(length);
  let have = 0;
  const reader = res.body!.getReader();
  try {
    while (have < length) {
      const { value, done } = await reader.read();
      if (done) break;
      const chunk = value.subarray(Math.min(skip, value.length));
      skip -= value.length - chunk.length;
      const n = Math.min(chunk.length, length - have);
      out.set(chunk.subarray(0, n), have);
      have += n;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
  return out.subarray(0, have);
}
