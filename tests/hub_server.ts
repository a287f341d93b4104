/**
 * A local stand-in for the Hugging Face Hub on 127.0.0.1, speaking the part of its
 * protocol `k3 pull` uses: `GET /api/models/OWNER/NAME/revision/REV?blobs=true` (the file
 * list with sizes, git blob ids and LFS SHA-256s), `GET /OWNER/NAME/resolve/COMMIT/PATH`
 * (small files answered directly, LFS files redirected to a second server on another
 * port, the "CDN", which honours Range requests, open `bytes=N-` and closed `bytes=N-M`).
 * Faults are switched on per test: a token required (401), a rate limit with Retry-After
 * (429), a transfer cut or stalled after N bytes, corrupted content, Range headers
 * ignored. Every request is recorded.
 *
 * @module
 */

import { createHash } from "node:crypto";

/** One file of the served repository. */
export interface RepoFile {
  path: string;
  bytes: Uint8Array;
  /** Served through LFS (redirect to the CDN, SHA-256 listed). */
  lfs: boolean;
}

/** A request as the servers saw it. */
export interface SeenRequest {
  server: "hub" | "cdn";
  path: string;
  range: string | null;
  authorization: string | null;
}

/** Switchable faults. */
export interface Faults {
  /** Every hub request needs `authorization: Bearer <token>` (401 otherwise). */
  token?: string;
  /** The next this-many file-list requests answer 429 with `Retry-After: 1`. */
  rateLimited?: number;
  /** The next body of this file that runs past byte `bytes` stops there (connection dropped). */
  cut?: { path: string; bytes: number };
  /** The next body of this file that runs past byte `bytes` sends up to it and then nothing
   * until the client goes. */
  stall?: { path: string; bytes: number; reached?: () => void };
  /** Bodies of this file that run to its end have one byte flipped (the next `times` of
   * them; a ranged read of its header is left alone). */
  corrupt?: { path: string; times: number };
  /** Range headers are ignored: every body is the whole file, with status 200. */
  noRanges?: boolean;
}

/** The commit every revision resolves to. */
export const COMMIT = "0123456789abcdef0123456789abcdef01234567";

/** The running pair of servers. */
export interface HubServer {
  /** http://127.0.0.1:PORT of the hub (HF_ENDPOINT). */
  endpoint: string;
  /** The repository id served (`k3test/tiny`). */
  repo: string;
  /** Requests seen so far. */
  seen: SeenRequest[];
  /** Faults in force (mutable). */
  faults: Faults;
  /** Stops both servers. */
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

function sha(kind: "sha256" | "sha1", ...parts: (string | Uint8Array)[]): string {
  const h = createHash(kind);
  for (const p of parts) h.update(p);
  return h.digest("hex");
}

/** The repository made of every file of `dir` (safetensors through LFS) plus `extra`. */
export async function repoFromDir(dir: string, extra: Record<string, string> = {}): Promise<RepoFile[]> {
  const files: RepoFile[] = [];
  for await (const e of Deno.readDir(dir)) {
    if (e.isFile) {
      files.push({
        path: e.name,
        bytes: await Deno.readFile(`${dir}/${e.name}`),
        lfs: e.name.endsWith(".safetensors"),
      });
    }
  }
  for (const [path, text] of Object.entries(extra)) {
    files.push({ path, bytes: new TextEncoder().encode(text), lfs: false });
  }
  return files.sort((a, b) => a.path.localeCompare(b.path));
}

/** A body that sends bytes [from, to) of the file, honouring the cut and stall faults. */
function body(f: RepoFile, from: number, to: number, faults: Faults): BodyInit {
  let data = f.bytes.subarray(from, to);
  if (faults.corrupt?.path === f.path && faults.corrupt.times > 0 && to === f.bytes.length) {
    faults.corrupt.times--;
    data = data.slice();
    data[Math.floor(data.length / 2)] ^= 0xff;
  }
  const reaches = <T extends { path: string; bytes: number }>(fault?: T) =>
    fault?.path === f.path && from < fault.bytes && to > fault.bytes ? fault : undefined;
  const cut = reaches(faults.cut);
  const stall = reaches(faults.stall);
  if (!cut && !stall) return data as Uint8Array<ArrayBuffer>;
  if (cut) faults.cut = undefined;
  if (stall) faults.stall = undefined;
  const upTo = (cut ?? stall)!.bytes - from;
  let sent = false;
  return new ReadableStream({
    pull(c) {
      if (!sent) {
        sent = true;
        c.enqueue(data.slice(0, upTo));
        return;
      }
      // Asked for more: the first part has gone out.
      if (cut) return c.error(new Error("connection cut by the test"));
      stall!.reached?.();
      return new Promise<void>(() => {});
    },
  });
}

/** Serves `files` as the repository `repo`; see the module doc. */
export function startHub(files: RepoFile[], repo = "k3test/tiny"): HubServer {
  const seen: SeenRequest[] = [];
  const faults: Faults = {};
  const byPath = new Map(files.map((f) => [f.path, f]));
  const bySha = new Map(files.map((f) => [sha("sha256", f.bytes), f]));
  const record = (server: "hub" | "cdn", req: Request) =>
    seen.push({
      server,
      path: new URL(req.url).pathname,
      range: req.headers.get("range"),
      authorization: req.headers.get("authorization"),
    });

  const content = (f: RepoFile, req: Request, headers: Record<string, string>): Response => {
    const m = faults.noRanges ? null : req.headers.get("range")?.match(/^bytes=(\d+)-(\d*)$/);
    const from = m ? Number(m[1]) : 0;
    if (from >= f.bytes.length && m) return new Response(null, { status: 416 });
    // An open range runs to the end; a closed one (`bytes=0-65535`) to its last byte.
    const to = m?.[2] ? Math.min(Number(m[2]) + 1, f.bytes.length) : f.bytes.length;
    const h: Record<string, string> = { ...headers, "content-length": String(to - from) };
    if (m) h["content-range"] = `bytes ${from}-${to - 1}/${f.bytes.length}`;
    return new Response(body(f, from, to, faults), { status: m ? 206 : 200, headers: h });
  };

  const cdn = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
    record("cdn", req);
    const f = bySha.get(new URL(req.url).pathname.replace(/^\/blobs\//, ""));
    return f ? content(f, req, {}) : new Response("no such blob", { status: 404 });
  });
  const cdnUrl = `http://127.0.0.1:${cdn.addr.port}`;

  const hub = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
    record("hub", req);
    if (faults.token && req.headers.get("authorization") !== `Bearer ${faults.token}`) {
      return Response.json({ error: "Invalid credentials" }, { status: 401 });
    }
    const url = new URL(req.url);
    const list = url.pathname.match(/^\/api\/models\/([^/]+\/[^/]+)\/revision\/([^/]+)$/);
    if (list) {
      if (list[1] !== repo) return Response.json({ error: "Repository not found" }, { status: 404 });
      if (faults.rateLimited) {
        faults.rateLimited--;
        return new Response("slow down", { status: 429, headers: { "retry-after": "1" } });
      }
      return Response.json({
        id: repo,
        sha: COMMIT,
        siblings: files.map((f) => ({
          rfilename: f.path,
          size: f.bytes.length,
          blobId: sha("sha1", `blob ${f.bytes.length}\0`, f.bytes),
          ...(f.lfs ? { lfs: { sha256: sha("sha256", f.bytes), size: f.bytes.length, pointerSize: 134 } } : {}),
        })),
      });
    }
    const prefix = `/${repo}/resolve/${COMMIT}/`;
    if (!url.pathname.startsWith(prefix)) return new Response("not found", { status: 404 });
    const f = byPath.get(decodeURIComponent(url.pathname.slice(prefix.length)));
    if (!f) return new Response("Entry not found", { status: 404 });
    const headers = { "x-repo-commit": COMMIT, etag: `"${sha("sha1", `blob ${f.bytes.length}\0`, f.bytes)}"` };
    if (!f.lfs) return content(f, req, headers);
    const digest = sha("sha256", f.bytes);
    return new Response(null, {
      status: 302,
      headers: {
        ...headers,
        location: `${cdnUrl}/blobs/${digest}`,
        "x-linked-etag": `"${digest}"`,
        "x-linked-size": String(f.bytes.length),
      },
    });
  });

  const close = async () => {
    await Promise.all([hub.shutdown(), cdn.shutdown()]);
  };
  return {
    endpoint: `http://127.0.0.1:${hub.addr.port}`,
    repo,
    seen,
    faults,
    close,
    [Symbol.asyncDispose]: close,
  };
}
