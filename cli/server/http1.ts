/**
 * HTTP/1.1 for `k3 serve` on `Deno.listen`, because `Deno.serve` cannot be made to see a
 * client go away in every shape of request: when the body arrives in a TCP segment of its
 * own (what Node's fetch and the official SDKs send), `request.signal` never aborts after
 * the client closes (measured: the socket stays in CLOSE-WAIT and the handler runs to
 * the end), and it offers no header, body or idle timeout and no connection cap.
 *
 * Here each connection has one reader that keeps reading while its request is handled, so
 * an end of stream is seen at once and aborts the request's `gone` signal; the request
 * head must arrive within the header timeout, its body within the body timeout, a
 * keep-alive connection may sit idle for the idle timeout; beyond the connection cap a
 * new connection is answered 503 and closed. Bodies are read only when the handler asks
 * (after its key check), so a refused request costs only its head.
 *
 * Writes go through one {@link ConnWriter} per connection: one at a time, and a write
 * that makes no progress for the send timeout closes the connection (its request is gone,
 * its slot freed). An end of stream after a complete request may be a half-close (the
 * client still reads): the connection is probed (an interim 102, or an event-stream
 * comment) and only a reset or a failed write means the client is gone.
 *
 * @module
 */

/** Limits of the HTTP layer (seconds and counts). */
export interface Http1Limits {
  /** From a connection's first byte (or its open) to the end of the request head. */
  headerTimeoutSeconds: number;
  /** From the end of the head to the last byte of the body. */
  bodyTimeoutSeconds: number;
  /** A kept-alive connection waiting for its next request. */
  idleTimeoutSeconds: number;
  /** Connections open at once; more are answered 503 and closed. */
  maxConnections: number;
  /** Largest request head (request line and headers). */
  maxHeadBytes: number;
  /** A write that makes no progress for this long closes its connection (default
   * {@link DEFAULT_SEND_TIMEOUT_SECONDS}). */
  sendTimeoutSeconds?: number;
}

/** Seconds a write may make no progress when the limits name none. */
export const DEFAULT_SEND_TIMEOUT_SECONDS = 30;

/** Handles one request; `gone` aborts when its client goes away or is cut off. */
export type Http1Handler = (req: Request, gone: AbortSignal, remote: Deno.NetAddr) => Promise<Response>;

/** Why a request could not be read: the client closed, or was too slow (a timeout). */
export class ClientGone extends Error {
  /** `cause`: "closed" or which timeout. */
  constructor(readonly why: "closed" | "header timeout" | "body timeout") {
    super(`client ${why === "closed" ? "closed the connection" : why}`);
  }
}

/** The request head is malformed or too large: answered with `status` and closed. */
class BadHead extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

const REASONS: Record<number, string> = {
  200: "OK",
  204: "No Content",
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  408: "Request Timeout",
  411: "Length Required",
  413: "Content Too Large",
  415: "Unsupported Media Type",
  421: "Misdirected Request",
  429: "Too Many Requests",
  431: "Request Header Fields Too Large",
  500: "Internal Server Error",
  501: "Not Implemented",
  503: "Service Unavailable",
};

const enc = new TextEncoder();
const latin1 = new TextDecoder("latin1");

/** A canned answer written by this layer itself (the handler never sees the request). */
function canned(status: number, message: string): Uint8Array {
  const body = JSON.stringify({ error: { message, type: "invalid_request_error", param: null, code: null } });
  return enc.encode(
    `HTTP/1.1 ${status} ${REASONS[status] ?? "Error"}\r\ncontent-type: application/json\r\n` +
      `content-length: ${enc.encode(body).length}\r\nconnection: close\r\n\r\n${body}`,
  );
}

/** One connection's bytes: a reader that runs ahead of the parser (bounded) to see EOF. */
class ConnBytes {
  #buf = new Uint8Array(0);
  #eof = false;
  #reset = false;
  #wake: (() => void) | undefined;
  #room: (() => void) | undefined;
  /** Aborted at end of stream or a read error. */
  readonly closed = new AbortController();

  constructor(readonly conn: Deno.Conn, readonly cap: number) {
    void this.#pump();
  }

  async #pump(): Promise<void> {
    const chunk = new Uint8Array(16384);
    try {
      while (true) {
        // Bounded read-ahead: a client that pipelines more than `cap` waits for the parser.
        while (this.#buf.length >= this.cap) await new Promise<void>((r) => (this.#room = r));
        const n = await this.conn.read(chunk);
        if (n === null) break;
        const next = new Uint8Array(this.#buf.length + n);
        next.set(this.#buf);
        next.set(chunk.subarray(0, n), this.#buf.length);
        this.#buf = next;
        this.#wake?.();
      }
    } catch {
      // A reset, or a close from our side: the client cannot read any more.
      this.#reset = true;
    }
    this.#eof = true;
    this.closed.abort(new ClientGone("closed"));
    this.#wake?.();
  }

  /** Bytes buffered and not yet taken. */
  get buffered(): number {
    return this.#buf.length;
  }

  /** True once the client's side has ended (buffered bytes may remain). */
  get eof(): boolean {
    return this.#eof;
  }

  /** True when the reading ended in an error (a reset), not an end of stream. */
  get reset(): boolean {
    return this.#reset;
  }

  /** Drops the empty lines a client may send before a request line (RFC 9112 2.2). */
  dropEmptyLines(): void {
    let i = 0;
    while (i < this.#buf.length && (this.#buf[i] === 13 || this.#buf[i] === 10)) i++;
    if (i > 0) this.take(i);
  }

  /** Waits for more bytes (false: end of stream, or `deadline` passed). */
  async more(deadline: number): Promise<boolean> {
    if (this.#eof) return false;
    const wait = deadline - Date.now();
    if (wait <= 0) return false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const got = await new Promise<boolean>((resolve) => {
      this.#wake = () => resolve(true);
      timer = setTimeout(() => resolve(false), wait);
    });
    clearTimeout(timer);
    this.#wake = undefined;
    return got && !this.#eof;
  }

  /** Takes up to `n` buffered bytes. */
  take(n: number): Uint8Array {
    const out = this.#buf.subarray(0, Math.min(n, this.#buf.length));
    this.#buf = this.#buf.subarray(out.length);
    if (this.#buf.length < this.cap) this.#room?.();
    return out;
  }

  /** Where the head ends (after CRLFCRLF) in the buffer, or -1. */
  headEnd(): number {
    const b = this.#buf;
    for (let i = 3; i < b.length; i++) {
      if (b[i] === 10 && b[i - 1] === 13 && b[i - 2] === 10 && b[i - 3] === 13) return i + 1;
    }
    return -1;
  }
}

/** What a connection has been sent of the current exchange, which decides its probe. */
type Sent = "nothing" | "event stream" | "body";

/** The bytes that probe a connection after `sent`: none while a body is being written. */
function probeBytes(sent: Sent, version: string): Uint8Array | null {
  // An interim response any HTTP/1.1 client skips (RFC 9110 15.2); never to HTTP/1.0.
  if (sent === "nothing") return version === "1.1" ? enc.encode("HTTP/1.1 102 Processing\r\n\r\n") : null;
  // A comment line in an event stream, as one chunk: clients skip it.
  if (sent === "event stream") return enc.encode("3\r\n:\n\n\r\n");
  return null;
}

/** Waits `ms` milliseconds. */
function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * One connection's writes, one at a time (a probe never splits a chunk); a write that
 * makes no progress for `timeoutMs` closes the connection and fails.
 */
class ConnWriter {
  #queue: Promise<unknown> = Promise.resolve();
  #failed = false;
  /** What the current exchange has sent. */
  sent: Sent = "nothing";

  constructor(readonly conn: Deno.Conn, readonly timeoutMs: number, readonly onTimeout: () => void) {}

  /** Writes all of `data` (or what `data()` gives when its turn comes; null: nothing);
   * false when the connection is gone or was cut off. */
  write(data: Uint8Array | (() => Uint8Array | null)): Promise<boolean> {
    const turn = this.#queue.then(() => {
      const bytes = typeof data === "function" ? data() : data;
      return bytes === null ? !this.#failed : this.#writeAll(bytes);
    });
    this.#queue = turn;
    return turn;
  }

  async #writeAll(data: Uint8Array): Promise<boolean> {
    if (this.#failed) return false;
    let off = 0;
    try {
      while (off < data.length) {
        let timer: ReturnType<typeof setTimeout> | undefined;
        const stalled = new Promise<null>((r) => (timer = setTimeout(() => r(null), this.timeoutMs)));
        const n = await Promise.race([this.conn.write(data.subarray(off)), stalled]);
        clearTimeout(timer);
        if (n === null) {
          // The client stopped reading: closing frees the connection and ends the write.
          this.#failed = true;
          this.onTimeout();
          closeQuietly(this.conn);
          return false;
        }
        off += n;
      }
      return true;
    } catch {
      this.#failed = true;
      return false;
    }
  }
}

/** Closes `conn`, which may be closed already. */
function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch { /* already closed */ }
}

/** A parsed request head. */
interface Head {
  method: string;
  target: string;
  version: string;
  headers: Headers;
}

function parseHead(text: string): Head {
  const lines = text.split("\r\n");
  const m = /^([A-Z]{1,16}) (\S{1,16384}) HTTP\/(1\.[01])$/.exec(lines[0]);
  if (!m) throw new BadHead(400, "malformed request line");
  const headers = new Headers();
  for (const line of lines.slice(1)) {
    if (line === "") continue;
    const colon = line.indexOf(":");
    if (colon <= 0) throw new BadHead(400, "malformed header line");
    try {
      headers.append(line.slice(0, colon), line.slice(colon + 1).trim());
    } catch {
      throw new BadHead(400, "malformed header line");
    }
  }
  return { method: m[1], target: m[2], version: m[3], headers };
}

/** A listening HTTP/1.1 server. */
export class Http1Server {
  /** Where it listens. */
  readonly addr: Deno.NetAddr;
  /** Resolves when the listener is closed and every connection has ended. */
  readonly finished: Promise<void>;
  readonly #listener: Deno.Listener<Deno.TcpConn, Deno.NetAddr>;
  readonly #conns = new Map<Deno.Conn, { busy: boolean }>();
  #closing = false;
  #sendTimeouts = 0;
  #allClosed: (() => void) | undefined;

  /** Listens on `hostname:port` and answers with `handler` within `limits`. */
  constructor(hostname: string, port: number, readonly limits: Http1Limits, readonly handler: Http1Handler) {
    this.#listener = Deno.listen({ hostname, port, transport: "tcp" });
    this.addr = this.#listener.addr;
    this.finished = this.#accept();
  }

  /** Connections open now. */
  get connections(): number {
    return this.#conns.size;
  }

  /** Connections closed because a write made no progress for the send timeout. */
  get sendTimeouts(): number {
    return this.#sendTimeouts;
  }

  async #accept(): Promise<void> {
    try {
      for await (const conn of this.#listener) {
        if (this.#conns.size >= this.limits.maxConnections) {
          // The fixed cost of refusing: one canned write, no reading, no parsing.
          conn.write(canned(503, "too many connections")).catch(() => {}).finally(() => conn.close());
          continue;
        }
        const state = { busy: false };
        this.#conns.set(conn, state);
        void this.#serveConn(conn, state).finally(() => {
          this.#conns.delete(conn);
          closeQuietly(conn);
          if (this.#closing && this.#conns.size === 0) this.#allClosed?.();
        });
      }
    } catch {
      // The listener was closed.
    }
    if (this.#conns.size > 0) await new Promise<void>((r) => (this.#allClosed = r));
  }

  /**
   * Stops accepting, closes idle connections; busy ones close after their response, or
   * `cutSeconds` from now whatever their client does (default: no cut).
   */
  async shutdown(cutSeconds = Infinity): Promise<void> {
    this.#closing = true;
    try {
      this.#listener.close();
    } catch { /* already closed */ }
    for (const [conn, s] of this.#conns) if (!s.busy) closeQuietly(conn);
    if (!Number.isFinite(cutSeconds)) return await this.finished;
    const cut = setTimeout(() => {
      for (const conn of this.#conns.keys()) closeQuietly(conn);
    }, cutSeconds * 1000);
    try {
      await this.finished;
    } finally {
      clearTimeout(cut);
    }
  }

  async #serveConn(conn: Deno.TcpConn, state: { busy: boolean }): Promise<void> {
    const lim = this.limits;
    const bytes = new ConnBytes(conn, lim.maxHeadBytes + 65536);
    const out = new ConnWriter(
      conn,
      1000 * (lim.sendTimeoutSeconds ?? DEFAULT_SEND_TIMEOUT_SECONDS),
      () => this.#sendTimeouts++,
    );
    let first = true;
    while (!this.#closing) {
      // Idle: wait for the next request's first byte (empty lines before it are skipped).
      const idleUntil = Date.now() + 1000 * (first ? lim.headerTimeoutSeconds : lim.idleTimeoutSeconds);
      for (bytes.dropEmptyLines(); bytes.buffered === 0; bytes.dropEmptyLines()) {
        if (!(await bytes.more(idleUntil))) return;
      }
      state.busy = true;
      const headUntil = Date.now() + 1000 * lim.headerTimeoutSeconds;
      let end: number;
      while ((end = bytes.headEnd()) < 0) {
        if (bytes.buffered > lim.maxHeadBytes) return void await out.write(canned(431, "request head too large"));
        if (!(await bytes.more(headUntil))) {
          if (!bytes.eof) await out.write(canned(408, "request head timed out"));
          return;
        }
      }
      if (end > lim.maxHeadBytes) return void await out.write(canned(431, "request head too large"));
      first = false;
      let head: Head;
      try {
        head = parseHead(latin1.decode(bytes.take(end)).slice(0, -4));
      } catch (e) {
        return void await out.write(canned((e as BadHead).status ?? 400, (e as Error).message));
      }
      out.sent = "nothing";
      const keep = await this.#exchange(conn, bytes, out, head);
      state.busy = false;
      if (!keep) return;
    }
  }

  /** The Host of a request that sent none: this listener (HTTP/1.0 needs no Host). */
  #listenerHost(): string {
    const { hostname, port } = this.addr;
    return hostname.includes(":") ? `[${hostname}]:${port}` : `${hostname}:${port}`;
  }

  /**
   * After the client's end of stream with its request complete: a half-close (it still
   * reads) or a close. Probes, at once, shortly after and a second later; a failed probe
   * means gone. Stops when the exchange has `ended`.
   */
  async #probe(out: ConnWriter, version: string, gone: AbortController, ended: AbortSignal): Promise<void> {
    for (const wait of [0, 50, 1000]) {
      if (wait) await sleep(wait);
      if (ended.aborted || gone.signal.aborted) return;
      if (!(await out.write(() => probeBytes(out.sent, version)))) gone.abort(new ClientGone("closed"));
    }
  }

  /** One request and its response; true when the connection may carry another. */
  async #exchange(conn: Deno.TcpConn, bytes: ConnBytes, out: ConnWriter, head: Head): Promise<boolean> {
    const lim = this.limits;
    const h = head.headers;
    if (h.has("transfer-encoding")) {
      await out.write(canned(411, "send the body with content-length (chunked bodies are not accepted)"));
      return false;
    }
    const cl = h.get("content-length");
    if (cl !== null && !/^\d{1,15}$/.test(cl)) {
      await out.write(canned(400, "malformed content-length"));
      return false;
    }
    let remaining = cl === null ? 0 : Number(cl);
    // Content-Length defines a body whatever the method (RFC 9112 6.3): one on GET or HEAD
    // is refused and the connection closed, so its bytes are never read as a request.
    if (remaining > 0 && (head.method === "GET" || head.method === "HEAD")) {
      await out.write(canned(400, `a ${head.method} request takes no body`));
      return false;
    }
    if (!h.has("host") && head.version === "1.0") h.set("host", this.#listenerHost());
    const gone = new AbortController();
    const ended = new AbortController();
    // A reset, or an end of stream before the body is complete, means gone; an end of
    // stream after a complete request may be a half-close: probed.
    const onClosed = () => {
      if (bytes.reset || bytes.buffered < remaining) gone.abort(bytes.closed.signal.reason);
      else void this.#probe(out, head.version, gone, ended.signal);
    };
    bytes.closed.signal.addEventListener("abort", onClosed);
    if (bytes.closed.signal.aborted) onClosed();
    const bodyUntil = Date.now() + 1000 * lim.bodyTimeoutSeconds;
    const hasBody = remaining > 0;
    // curl asks before sending a body over 1 kB: answer once the handler wants the body.
    let askedToContinue = /^100-continue$/i.test(h.get("expect") ?? "");
    const body = hasBody
      ? new ReadableStream<Uint8Array>({
        pull: async (c) => {
          if (askedToContinue) {
            askedToContinue = false;
            if (bytes.buffered === 0) await out.write(enc.encode("HTTP/1.1 100 Continue\r\n\r\n"));
          }
          while (bytes.buffered === 0) {
            if (!(await bytes.more(bodyUntil))) {
              const why = bytes.eof ? new ClientGone("closed") : new ClientGone("body timeout");
              if (why.why === "body timeout") gone.abort(why);
              return c.error(why);
            }
          }
          const piece = bytes.take(remaining);
          remaining -= piece.length;
          c.enqueue(piece.slice());
          if (remaining === 0) c.close();
        },
      }, { highWaterMark: 0 })
      : null;
    const host = h.get("host") ?? `${this.addr.hostname}:${this.addr.port}`;
    let req: Request;
    try {
      req = new Request(`http://${/^[\w.:\[\]-]{1,300}$/.test(host) ? host : "invalid"}${head.target}`, {
        method: head.method,
        headers: h,
        body,
      });
    } catch {
      await out.write(canned(400, "malformed request target"));
      return false;
    }
    try {
      const res = await this.handler(req, gone.signal, conn.remoteAddr as Deno.NetAddr);
      // A client whose side has ended sends no next request: its connection closes.
      const keepAlive = head.version === "1.1" && !/\bclose\b/i.test(h.get("connection") ?? "") &&
        remaining === 0 && !this.#closing && !gone.signal.aborted && !bytes.eof;
      const whole = await this.#respond(out, res, head.method === "HEAD", keepAlive, gone);
      return keepAlive && whole && !gone.signal.aborted;
    } finally {
      ended.abort();
      bytes.closed.signal.removeEventListener("abort", onClosed);
    }
  }

  /** Writes `res`: a known length as is, a stream chunked; stops when the client is gone.
   * True when the whole response was written. */
  async #respond(
    out: ConnWriter,
    res: Response,
    headOnly: boolean,
    keep: boolean,
    gone: AbortController,
  ): Promise<boolean> {
    const lines = [`HTTP/1.1 ${res.status} ${REASONS[res.status] ?? "Status"}`];
    res.headers.forEach((v, k) => {
      if (k !== "content-length" && k !== "connection" && k !== "transfer-encoding") lines.push(`${k}: ${v}`);
    });
    lines.push(`connection: ${keep ? "keep-alive" : "close"}`);
    const streamed = res.headers.get("content-type")?.startsWith("text/event-stream") ?? false;
    if (!streamed || !res.body) {
      const data = res.body ? new Uint8Array(await res.arrayBuffer()) : new Uint8Array(0);
      lines.push(`content-length: ${data.length}`);
      const headBytes = enc.encode(lines.join("\r\n") + "\r\n\r\n");
      const bytes = new Uint8Array(headBytes.length + (headOnly ? 0 : data.length));
      bytes.set(headBytes);
      if (!headOnly) bytes.set(data, headBytes.length);
      out.sent = "body";
      if (await out.write(bytes)) return true;
      gone.abort(new ClientGone("closed"));
      return false;
    }
    lines.push("transfer-encoding: chunked");
    const reader = res.body.getReader();
    const stop = () => void reader.cancel(gone.signal.reason).catch(() => {});
    gone.signal.addEventListener("abort", stop);
    try {
      out.sent = "event stream";
      if (!(await out.write(enc.encode(lines.join("\r\n") + "\r\n\r\n")))) {
        gone.abort(new ClientGone("closed"));
        return false;
      }
      while (true) {
        const { value, done } = await reader.read();
        if (done) break;
        if (!value?.length) continue;
        const size = enc.encode(value.length.toString(16) + "\r\n");
        const piece = new Uint8Array(size.length + value.length + 2);
        piece.set(size);
        piece.set(value, size.length);
        piece.set([13, 10], size.length + value.length);
        if (!(await out.write(piece))) {
          gone.abort(new ClientGone("closed"));
          return false;
        }
      }
      out.sent = "body";
      return !gone.signal.aborted && await out.write(enc.encode("0\r\n\r\n"));
    } catch {
      // The body was cancelled (the client went away) or failed (its output overflowed).
      return false;
    } finally {
      gone.signal.removeEventListener("abort", stop);
    }
  }
}
