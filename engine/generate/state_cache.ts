/**
 * The conversation state cache: sequence states kept under their exact token prefix, so a
 * request whose ids start with a kept prefix continues from its state and prefills only
 * the rest (`k3 serve` across requests, `k3 batch` across lines).
 *
 * A KDA layer's recurrent state folds every token in and cannot be rewound, so a state is
 * only ever reused for exactly the prefix it processed: entries sit on the nodes of a
 * radix trie over token ids, a lookup walks the request's ids and takes the deepest entry
 * on its path, and nothing ever matches part of an entry. The scheduler keeps entries at
 * the positions its callers name (message boundaries of the chat template, prefixes lines
 * of a batch share), so the trie holds few, long entries.
 *
 * An entry is a {@link SequenceState.snapshot}: every byte the forward pass reads at that
 * position (KDA conv histories and S, the MLA latent cache up to the position), in the
 * saved-state payload's order. RAM entries are evicted least recently used first when their
 * bytes exceed the budget; with a spill directory an evicted entry is written there as a
 * saved-state file (engine/generate/state_file.ts: checksummed, atomic), named by the
 * SHA-256 of its tokens, and the directory is itself bounded (oldest used files removed
 * first). A hit on disk is read back only when the read is estimated cheaper than
 * prefilling the same tokens (the measured read rate against the measured cost of a
 * prefill pass), and each such decision is logged. The rate leans on the latest reads
 * (older ones count half at each new read), and after {@link REMEASURE_AFTER} declined
 * reads one is read anyway, so a single slow read never turns the disk tier off for the
 * rest of the run. The read runs on the I/O threads and
 * {@link StateCache.find} hands back a promise, so the scheduler keeps computing other
 * sequences until the state lands. A file that fails any check is refused, deleted, and
 * its tokens prefilled.
 *
 * The directory is the truth about the disk budget, since other processes may share it:
 * before each spill (and at start) the cache takes the directory's lock (flock on the
 * directory), scans it, and makes room under the budget for the new file counting every
 * file a spill leaves: spill files (another process's too: it takes them in and may use
 * them), temporaries being written (`NAME.k3state.tmp-PID-TIME`, created at their full
 * size and renamed into place under the lock, so every writer counts every other's), and
 * removes the temporaries of a process that is gone (a spill killed mid-write) as it finds
 * them.
 *
 * @module
 */

import { createHash } from "node:crypto";
import { join } from "node:path";
import { K3Error } from "../errors.ts";
import type { K3Model } from "../model/model.ts";
import { bytesText } from "../native/available.ts";
import { statKind } from "../native/files.ts";
import {
  checkStateFile,
  type ModelFingerprint,
  readStateFile,
  type StateFile,
  writeStatePayload,
} from "./state_file.ts";
import {
  type ChatMessage,
  chatPrompt,
  generationPromptIds,
  messageBoundaries,
  type MessageSpan,
  replyCloser,
} from "../text/chat.ts";
import type { Tokenizer } from "../text/tokenizer.ts";

/** How a state cache is set up. */
export interface StateCacheOptions {
  /** Bytes of RAM entries at most (0: nothing is kept in RAM; spilled entries still are). */
  ramBytes: number;
  /** Directory evicted entries are written to (none: evicted entries are dropped). */
  dir?: string;
  /** Bytes of spill files at most (default: unbounded). */
  diskBytes?: number;
  /** The model's fingerprint, written into and checked against every spill file. */
  fingerprint?: ModelFingerprint;
  /** Where decisions (disk read or prefill, refused files) are logged (default: nowhere). */
  log?: (line: string) => void;
  /** Reads a spill file (default: {@link readStateFile}, on the I/O threads); a test wraps
   * it to hold a read in flight. */
  read?: (path: string) => Promise<StateFile>;
}

/** Counters of a state cache, for /metrics and reports. */
export interface StateCacheStats {
  /** Lookups that found an entry (RAM or disk, read back). */
  hits: number;
  /** Lookups that found none (or only a disk entry not worth reading). */
  misses: number;
  /** RAM entries evicted (spilled or dropped). */
  evictions: number;
  /** Bytes of RAM entries now. */
  bytes: number;
  /** RAM entries now. */
  entries: number;
  /** Hits read back from the spill directory. */
  diskHits: number;
  /** Bytes of spill files now. */
  diskBytes: number;
  /** Spill files now. */
  diskEntries: number;
  /**
   * Bytes in the spill directory at its last scan that are not spill files of this cache's
   * but count against its budget: temporaries being written (by this process or another
   * sharing the directory) and state files it cannot use.
   */
  diskOtherBytes: number;
  /** Spill files refused (damaged or not this model's) and recomputed. */
  refused: number;
  /** Temporary spill files left by a process that is gone, removed when the directory is scanned. */
  orphansRemoved: number;
  /** Positions served from the cache instead of prefilled. */
  cachedTokens: number;
}

/** A state found for a prefix: its length and payload (for {@link SequenceState.restore}). */
export interface CacheHit {
  /** Positions the state holds: the request's first `length` ids. */
  length: number;
  /** The snapshot. */
  payload: Uint8Array;
  /** Where it came from. */
  from: "ram" | "disk";
}

/** An entry: a state kept in RAM, or spilled to a file. */
interface Entry {
  tokens: number[];
  node: TrieNode;
  payload?: Uint8Array;
  file?: string;
  fileBytes: number;
}

/** A node of the radix trie: `edge` is the run of ids from its parent. */
interface TrieNode {
  edge: number[];
  children: Map<number, TrieNode>;
  entry?: Entry;
}

const newNode = (edge: number[]): TrieNode => ({ edge, children: new Map() });

/** The file name of a prefix: the SHA-256 of its ids (u32 little-endian). */
export function prefixKey(tokens: readonly number[]): string {
  return createHash("sha256").update(new Uint8Array(Uint32Array.from(tokens).buffer)).digest("hex");
}

/**
 * The ids that follow a chat's generation prompt when its history holds `message` (the
 * reply as the client was shown it): the template renders an earlier assistant turn as
 * the generation prompt's own markup (message, think channel) followed by the reasoning
 * the client sent back (none: an empty think channel), the response, the tool calls and
 * the closing markup. Undefined when the rendering does not start with the generation
 * prompt (then no state of the prompt continues into it).
 */
export function historyReplyIds(tok: Tokenizer, message: ChatMessage, thinking: boolean): number[] | undefined {
  const generationPrompt = generationPromptIds(tok, thinking);
  const rendered = chatPrompt(tok, [message], { thinking, effort: null, addGenerationPrompt: false });
  if (!generationPrompt.every((t, i) => rendered[i] === t)) return undefined;
  return rendered.slice(generationPrompt.length);
}

/**
 * Where a request's states are kept (`k3 serve`): after its first message (a system prompt
 * other conversations share; after the notes rendered before the messages, the tool
 * declaration and the effort, when `messages` says where they end), after its last
 * complete message (where the next turn of a chat continues), at the end of its messages
 * when notes follow them (a forced tool choice, a response format: the next step of a
 * forced-tool loop continues there, its notes coming after its new messages), and, for a
 * chat, after the reply closed as it was generated (found when the client sends the reply
 * back as generated, reasoning included) and after the reply as the client was shown it,
 * `shown(tokens)`, rendered without its reasoning (found when the client sends back only
 * the content and tool calls, as most do). A KDA state cannot drop the reasoning it has
 * read, so that last state is prefilled anew from the prompt's, after the reply, in a slot
 * no request wants.
 */
export function chatCachePoints(
  tok: Tokenizer,
  promptIds: readonly number[],
  chat?: { thinking: boolean },
  shown?: (tokens: readonly number[]) => ChatMessage,
  messages?: MessageSpan,
): {
  cacheAt: number[];
  replyTail?: (tokens: readonly number[]) => number[] | undefined;
  historyReply?: (tokens: readonly number[]) => number[] | undefined;
} {
  const bounds = messageBoundaries(tok, promptIds);
  const cacheAt: number[] = [];
  if (bounds.length > 0) {
    cacheAt.push(bounds.find((b) => b > (messages?.start ?? 0)) ?? bounds[0]);
    if (messages !== undefined && bounds.includes(messages.end)) cacheAt.push(messages.end);
    cacheAt.push(bounds[bounds.length - 1]);
  }
  return {
    cacheAt: [...new Set(cacheAt)],
    replyTail: chat ? (tokens) => replyCloser(tok, tokens, chat.thinking) : undefined,
    historyReply: chat && shown ? (tokens) => historyReplyIds(tok, shown(tokens), chat.thinking) : undefined,
  };
}

/** Exact-prefix state reuse across sequences; see the module doc. */
export class StateCache {
  readonly #root = newNode([]);
  /** RAM entries, least recently used first. */
  readonly #ram = new Map<Entry, true>();
  /** Spilled entries, least recently used first. */
  readonly #disk = new Map<Entry, true>();
  #ramBytes = 0;
  #diskBytes = 0;
  /** Bytes in the spill directory at the last scan that are not entries: see {@link #scan}. */
  #otherBytes = 0;
  readonly #spills = new Set<Promise<void>>();
  readonly #stats = { hits: 0, misses: 0, evictions: 0, diskHits: 0, refused: 0, cachedTokens: 0, orphansRemoved: 0 };
  /** Disk entries found since the last read and not read (estimated slower than prefill). */
  #declined = 0;
  /** Bytes and seconds of spill reads so far (the measured disk rate; writes are not
   * counted: their fsync says little about reading). */
  #ioBytes = 0;
  #ioSeconds = 0;
  /** Prefill cost measured by the scheduler: seconds per prefill pass and rows per pass. */
  #passSeconds = 0;
  #passRows = 0;

  /** A cache for `model` (its layout sizes every entry). */
  constructor(readonly model: K3Model, readonly opts: StateCacheOptions) {
    if (opts.dir && !opts.fingerprint) throw new Error("state cache: a spill directory needs the model fingerprint");
  }

  /** The counters now. */
  get stats(): StateCacheStats {
    return {
      ...this.#stats,
      bytes: this.#ramBytes,
      entries: this.#ram.size,
      diskBytes: this.#diskBytes,
      diskEntries: this.#disk.size,
      diskOtherBytes: this.#otherBytes,
    };
  }

  /** The node for exactly `tokens`, created (splitting edges) when `create`. */
  #node(tokens: readonly number[], create: boolean): TrieNode | undefined {
    let node = this.#root, i = 0;
    while (i < tokens.length) {
      let child = node.children.get(tokens[i]);
      if (!child) {
        if (!create) return undefined;
        child = newNode(tokens.slice(i));
        node.children.set(tokens[i], child);
        return child;
      }
      let j = 0;
      while (j < child.edge.length && i + j < tokens.length && child.edge[j] === tokens[i + j]) j++;
      if (j < child.edge.length) {
        if (!create) return undefined;
        // Split the edge at j: a middle node holding the common part.
        const mid = newNode(child.edge.slice(0, j));
        child.edge = child.edge.slice(j);
        mid.children.set(child.edge[0], child);
        node.children.set(tokens[i], mid);
        child = mid;
      }
      node = child;
      i += j;
    }
    return node;
  }

  /** Entries on the path of `ids` of at most `maxLength` positions, longest first. */
  #path(ids: readonly number[], maxLength: number): Entry[] {
    const found: Entry[] = [];
    let node = this.#root, i = 0;
    for (;;) {
      if (node.entry && i <= maxLength && i > 0) found.push(node.entry);
      if (i >= ids.length) break;
      const child = node.children.get(ids[i]);
      if (!child || i + child.edge.length > ids.length) break;
      if (!child.edge.every((t, j) => t === ids[i + j])) break;
      node = child;
      i += child.edge.length;
    }
    return found.reverse();
  }

  /** Positions of the longest entry for `ids` (at most `maxLength`), without using it. */
  peek(ids: readonly number[], maxLength: number): number {
    return this.#path(ids, maxLength)[0]?.tokens.length ?? 0;
  }

  /** True when an entry holds exactly `tokens`. */
  has(tokens: readonly number[]): boolean {
    return this.#node(tokens, false)?.entry !== undefined;
  }

  /**
   * The longest entry whose tokens are the first positions of `ids` (at most `maxLength`):
   * a RAM entry as is, a spilled one read back and verified when reading is estimated
   * cheaper than prefilling its positions. Undefined: prefill from the start.
   */
  async lookup(ids: readonly number[], maxLength: number): Promise<CacheHit | undefined> {
    return await this.find(ids, maxLength);
  }

  /**
   * {@link lookup} without waiting on the disk: a RAM hit (or a miss) comes back at once; when
   * the best entry is a spill file worth reading, a promise that settles once it has been
   * read and verified (or, refused, with the next shorter entry), so the caller can go on
   * computing other sequences meanwhile. `counted` false: an internal lookup (a reply's
   * state kept in an idle slot), left out of the hit, miss and cached-token counters.
   */
  find(
    ids: readonly number[],
    maxLength: number,
    counted = true,
  ): CacheHit | undefined | Promise<CacheHit | undefined> {
    return this.#from(this.#path(ids, maxLength), counted);
  }

  #from(entries: Entry[], counted: boolean): CacheHit | undefined | Promise<CacheHit | undefined> {
    for (let i = 0; i < entries.length; i++) {
      const e = entries[i];
      if (e.payload) {
        this.#touch(e);
        return this.#hit(e.tokens.length, e.payload, "ram", counted);
      }
      if (!e.file || !this.#worthReading(e)) continue;
      return this.#readSpill(e).then((payload) =>
        payload ? this.#hit(e.tokens.length, payload, "disk", counted) : this.#from(entries.slice(i + 1), counted)
      );
    }
    if (counted) this.#stats.misses++;
    return undefined;
  }

  #hit(length: number, payload: Uint8Array, from: "ram" | "disk", counted: boolean): CacheHit {
    if (counted) {
      this.#stats.hits++;
      if (from === "disk") this.#stats.diskHits++;
      this.#stats.cachedTokens += length;
    }
    return { length, payload, from };
  }

  /** Records one prefill pass (its seconds and rows): the cost a disk read is weighed against. */
  notePrefillPass(seconds: number, rows: number): void {
    this.#passSeconds += seconds;
    this.#passRows += rows;
  }

  /** Whether reading `e` back is estimated cheaper than prefilling its positions; logged. */
  #worthReading(e: Entry): boolean {
    const n = e.tokens.length;
    const rate = this.#ioSeconds > 0 ? this.#ioBytes / this.#ioSeconds : undefined;
    const prefill = this.#passRows > 0 ? (this.#passSeconds / this.#passRows) * n : undefined;
    const read = rate ? e.fileBytes / rate : undefined;
    const cheaper = read === undefined || prefill === undefined || read < prefill;
    // The rate may have been one slow moment: now and then a read measures it again.
    const remeasure = !cheaper && ++this.#declined >= REMEASURE_AFTER;
    const yes = cheaper || remeasure;
    if (yes) this.#declined = 0;
    this.opts.log?.(
      `state cache: ${n} positions on disk (${bytesText(e.fileBytes)}): ${
        read === undefined || prefill === undefined
          ? `no ${read === undefined ? "disk rate" : "prefill cost"} measured yet`
          : `read ~${read.toFixed(3)} s at ${bytesText(rate!)}/s vs prefill ~${prefill.toFixed(3)} s`
      }: ${cheaper ? "reading it" : remeasure ? "reading it to measure the disk rate again" : "prefilling instead"}`,
    );
    return yes;
  }

  /** Reads and verifies a spill file; a damaged one is refused, removed and forgotten. */
  async #readSpill(e: Entry): Promise<Uint8Array | undefined> {
    const t0 = performance.now();
    try {
      const file = await (this.opts.read ?? readStateFile)(e.file!);
      const { header, payload } = checkStateFile(file, this.model, this.opts.fingerprint!);
      if (header.tokens.length !== e.tokens.length || header.tokens.some((t, i) => t !== e.tokens[i])) {
        throw new K3Error(`state ${e.file}: holds a different token prefix than its name says; refusing it`);
      }
      const seconds = (performance.now() - t0) / 1000;
      this.#ioBytes = this.#ioBytes / 2 + file.bytes.length;
      this.#ioSeconds = this.#ioSeconds / 2 + seconds;
      this.opts.log?.(
        `state cache: read ${e.tokens.length} positions (${bytesText(file.bytes.length)}) from disk in ${
          seconds.toFixed(3)
        } s`,
      );
      this.#touch(e);
      return payload;
    } catch (err) {
      if (!(err instanceof K3Error)) throw err;
      const file = e.file!;
      this.#drop(e);
      if (!(await Deno.stat(file).then(() => true, () => false))) {
        this.opts.log?.(
          `state cache: ${file} is gone (evicted by another process sharing the directory); recomputing its ${e.tokens.length} positions`,
        );
        return undefined;
      }
      this.#stats.refused++;
      this.opts.log?.(`state cache: ${err.message}; recomputing its ${e.tokens.length} positions`);
      await Deno.remove(file).catch(() => {});
      return undefined;
    }
  }

  /** Marks `e` most recently used in its tier. */
  #touch(e: Entry): void {
    const tier = e.payload ? this.#ram : this.#disk;
    if (tier.delete(e)) tier.set(e, true);
  }

  /**
   * Keeps `payload` (a {@link SequenceState.snapshot}) as the state of exactly `tokens`; a
   * prefix already kept is only marked used. Evicts least recently used RAM entries past
   * the budget (spilling them when there is a directory).
   */
  put(tokens: readonly number[], payload: Uint8Array): void {
    if (tokens.length === 0) return;
    const node = this.#node(tokens, true)!;
    if (node.entry) return this.#touch(node.entry);
    const e: Entry = { tokens: [...tokens], node, payload, fileBytes: 0 };
    node.entry = e;
    this.#ram.set(e, true);
    this.#ramBytes += payload.length;
    this.#evict();
  }

  /** Evicts RAM entries, oldest first, until the RAM budget holds. */
  #evict(): void {
    while (this.#ramBytes > this.opts.ramBytes && this.#ram.size > 0) {
      const e = this.#ram.keys().next().value!;
      this.#ram.delete(e);
      this.#ramBytes -= e.payload!.length;
      this.#stats.evictions++;
      if (this.opts.dir) {
        const spill: Promise<void> = this.#spill(e, e.payload!).finally(() => this.#spills.delete(spill));
        this.#spills.add(spill);
      } else this.#drop(e);
    }
  }

  /**
   * Writes `e` to the spill directory (then forgets its payload), once room is made for
   * its file under the directory's budget; with no room, `e` is dropped.
   */
  async #spill(e: Entry, payload: Uint8Array): Promise<void> {
    const file = join(this.opts.dir!, `${prefixKey(e.tokens)}.k3state`);
    let written: boolean;
    try {
      written = await writeStatePayload(
        file,
        this.model.cfg,
        e.tokens,
        [payload],
        this.opts.fingerprint!,
        { writer: "state-cache" },
        {
          locked: (f) => this.#locked(f),
          makeRoom: async (bytes) => {
            if (await this.#makeRoom(bytes)) return true;
            const why = bytes > (this.opts.diskBytes ?? Infinity)
              ? "larger than its whole budget"
              : `${bytesText(this.#otherBytes)} of its budget are held by temporaries being written`;
            this.opts.log?.(
              `state cache: no room for ${e.tokens.length} positions (${
                bytesText(bytes)
              }) in ${this.opts.dir}: ${why}; dropping them`,
            );
            return false;
          },
        },
      );
    } catch (err) {
      this.opts.log?.(`state cache: cannot spill ${e.tokens.length} positions: ${(err as Error).message}`);
      written = false;
    }
    if (!written) {
      if (!e.payload || e.payload === payload) this.#drop(e);
      return;
    }
    if (e.node.entry !== e) return void (await Deno.remove(file).catch(() => {})); // dropped meanwhile
    // Another cache sharing the directory may have evicted the file already.
    const stat = await Deno.stat(file).catch(() => undefined);
    if (!stat) {
      if (!e.payload || e.payload === payload) this.#drop(e);
      return;
    }
    e.file = file;
    e.fileBytes = stat.size;
    if (!this.#ram.has(e)) e.payload = undefined;
    this.#disk.set(e, true);
    this.#diskBytes += e.fileBytes;
  }

  /**
   * Runs `f` holding the spill directory's lock (flock on the directory itself): the scan,
   * the evictions and the creation of a temporary at its full size are one step for every
   * cache sharing the directory, in this process or another, and a rename into place
   * another (a scan listing the directory meanwhile could miss the file under both names).
   */
  async #locked<T>(f: () => Promise<T>): Promise<T> {
    const dir = await Deno.open(this.opts.dir!, { read: true });
    try {
      await dir.lock(true);
      return await f();
    } finally {
      dir.close(); // releases the lock
    }
  }

  /**
   * Scans the directory ({@link #scan}), then removes the least recently used spill files
   * (then files it does not index) until `bytes` more fit in the budget; false when they
   * cannot (temporaries being written hold the rest).
   */
  async #makeRoom(bytes: number): Promise<boolean> {
    const cap = this.opts.diskBytes ?? Infinity;
    const others = await this.#scan();
    const used = () => this.#diskBytes + this.#otherBytes;
    while (used() + bytes > cap) {
      if (this.#disk.size > 0) {
        const e = this.#disk.keys().next().value!;
        const file = e.file!;
        this.#drop(e);
        await Deno.remove(file).catch(() => {});
      } else if (others.length > 0) {
        const o = others.shift()!;
        this.#otherBytes -= o.bytes;
        await Deno.remove(o.file).catch(() => {});
      } else break;
    }
    return used() + bytes <= cap;
  }

  /**
   * Reads the directory as it is now, since other processes may share it: spill files it
   * does not know are taken in (their headers only: each is verified in full when it is
   * used; oldest first), entries whose file is gone are forgotten, temporaries of a gone
   * process are removed, and everything else a spill could have left (temporaries being
   * written, this process's or another's, and `.k3state` files it cannot index: an
   * unreadable header, or a prefix it holds in RAM) is counted in `#otherBytes`. Returns
   * the removable part of the latter (those state files), oldest first.
   */
  async #scan(): Promise<{ file: string; bytes: number }[]> {
    const dir = this.opts.dir!;
    const known = new Map([...this.#disk.keys()].map((e) => [e.file!, e]));
    const seen = new Set<Entry>();
    const found: { file: string; bytes: number; mtime: number; tokens?: number[] }[] = [];
    let other = 0;
    for await (const f of Deno.readDir(dir)) {
      const file = join(dir, f.name);
      if (!f.isFile || (!f.name.endsWith(".k3state") && tempSpillPid(f.name) === undefined)) continue;
      const e = known.get(file);
      if (e) {
        seen.add(e);
        continue;
      }
      if (await this.#removeOrphan(file)) continue;
      const stat = await Deno.stat(file).catch(() => undefined);
      if (!stat) continue; // removed meanwhile
      if (tempSpillPid(f.name) !== undefined) {
        other += stat.size;
        continue;
      }
      const tokens = await headerTokens(file);
      found.push({ file, bytes: stat.size, mtime: stat.mtime?.getTime() ?? 0, tokens });
    }
    for (const e of known.values()) if (!seen.has(e)) this.#drop(e); // removed by another process
    found.sort((a, b) => a.mtime - b.mtime);
    const removable = [];
    for (const { file, bytes, tokens } of found) {
      if (!tokens || tokens.length === 0 || this.has(tokens)) {
        other += bytes;
        removable.push({ file, bytes });
        continue;
      }
      const node = this.#node(tokens, true)!;
      const e: Entry = { tokens, node, file, fileBytes: bytes };
      node.entry = e;
      this.#disk.set(e, true);
      this.#diskBytes += bytes;
    }
    this.#otherBytes = other;
    return removable;
  }

  /** Forgets `e` in every tier (its file, if any, is the caller's to remove). */
  #drop(e: Entry): void {
    if (this.#ram.delete(e)) this.#ramBytes -= e.payload!.length;
    if (this.#disk.delete(e)) this.#diskBytes -= e.fileBytes;
    if (e.node.entry === e) e.node.entry = undefined;
    e.payload = undefined;
    e.file = undefined;
  }

  /** Waits for the spills in flight (a test's hook; shutdown). */
  async settled(): Promise<void> {
    while (this.#spills.size > 0) await Promise.all([...this.#spills]);
  }

  /** Removes `file` when it is a temporary spill file whose process is gone; true if so. */
  async #removeOrphan(file: string): Promise<boolean> {
    const pid = tempSpillPid(file);
    if (pid === undefined || pid === Deno.pid || processAlive(pid)) return false;
    try {
      const bytes = (await Deno.stat(file)).size;
      await Deno.remove(file);
      this.#stats.orphansRemoved++;
      this.opts.log?.(`state cache: removed ${file} (${bytesText(bytes)}), left by process ${pid}, which is gone`);
    } catch { /* removed meanwhile */ }
    return true;
  }

  /**
   * Takes in the spill files a previous run (or another process sharing the directory)
   * left there, so the directory stays within its budget and a restarted server still
   * finds its conversations; see {@link #scan}. Files that are not state files are left
   * alone.
   */
  async index(): Promise<void> {
    const dir = this.opts.dir;
    if (!dir) return;
    await Deno.mkdir(dir, { recursive: true });
    await this.#locked(() => this.#makeRoom(0));
  }
}

/** Declined disk reads after which one is read anyway, to measure the rate again. */
export const REMEASURE_AFTER = 8;

/** The pid of a temporary spill file (`NAME.k3state.tmp-PID-TIME`), or undefined. */
export function tempSpillPid(name: string): number | undefined {
  const m = /\.k3state\.tmp-(\d+)-\d+$/.exec(name);
  return m ? Number(m[1]) : undefined;
}

/** Whether process `pid` is running: its /proc entry exists (Linux; asked of k3io when
 * the runtime refuses /proc). When that cannot be told, it is taken as running. */
function processAlive(pid: number): boolean {
  try {
    return statKind(`/proc/${pid}`) !== "missing";
  } catch {
    return true;
  }
}

/** The token prefix a state file's header names (undefined: not a readable state file). */
async function headerTokens(path: string): Promise<number[] | undefined> {
  let f: Deno.FsFile | undefined;
  try {
    f = await Deno.open(path);
    const head = new Uint8Array(16);
    if ((await f.read(head)) !== 16 || new TextDecoder().decode(head.subarray(0, 8)) !== "K3STATE\n") return undefined;
    const n = new DataView(head.buffer).getUint32(12, true);
    const json = new Uint8Array(n);
    let off = 0;
    while (off < n) {
      const got = await f.read(json.subarray(off));
      if (got === null) return undefined;
      off += got;
    }
    const tokens = JSON.parse(new TextDecoder().decode(json)).tokens;
    return Array.isArray(tokens) && tokens.every((t) => Number.isInteger(t) && t >= 0) ? tokens : undefined;
  } catch {
    return undefined;
  } finally {
    f?.close();
  }
}
