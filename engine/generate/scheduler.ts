/**
 * The scheduler: one loop that generates for many sequences at once on one model.
 *
 * Each forward pass carries the next decode token of every sequence in flight plus, within
 * the pass's row budget, the next prefill chunk of a sequence still reading its prompt
 * (continuous batching). The pass reads each trunk weight once for all its rows and each
 * chosen expert once (engine/model/model.ts `pass`); a sequence's logits have the same
 * bits whatever else shares its passes, so a sequence's tokens never depend on its company.
 *
 * A sequence is admitted when a state slot is free (the memory plan sized the states:
 * `maxSequences`), runs its prompt in chunks, then picks one token per pass with its own
 * `choose` (greedy by default) until a stop id, its caller's `onToken` says stop, its
 * token limit, or its abort signal. `k3 run` is the one-sequence use of this loop, `k3
 * batch` feeds it from JSONL and `k3 serve` from HTTP.
 *
 * @module
 */

import { setImmediate } from "node:timers";
import { EXIT, K3Error } from "../errors.ts";
import type { K3Model, Segment } from "../model/model.ts";
import type { SequenceState } from "../model/state.ts";
import { argmax } from "./sampling.ts";
import type { CacheHit, StateCache } from "./state_cache.ts";
import { DraftCost, type DraftOptions, DraftPolicy, type DraftStats, SequenceDrafter, SuffixPool } from "./draft.ts";
import type { Prefilled, SharedPrefill } from "./shared_prefill.ts";

/** Why a sequence ended: a stop id or stop string, its token limit, or its abort signal. */
export type FinishReason = "stop" | "length" | "interrupted";

/** One sequence to generate. */
export interface SequenceRequest {
  /** Token ids to prefill: the whole prompt, or the new suffix when `state` is given. */
  prompt: number[];
  /** Tokens to generate at most; 0 runs the prompt only. */
  maxTokens: number;
  /** Generation stops after emitting one of these (the id is kept in `tokens`). */
  stopIds?: readonly number[];
  /** Picks the next token from fp32 logits (a view valid only during the call). Default:
   * greedy argmax, ties to the lowest id. */
  choose?: (logits: Float32Array) => number;
  /** Constrains the tokens (structured output, forced tool calls): picks with `choose` from
   * the logits it masks in place (-Infinity), so `onToken` sees the masked logits. */
  grammar?: TokenFilter;
  /** Called for every generated token, in order, as soon as it exists. Return true to stop
   * here with finish reason "stop" (stop strings are matched by the caller). */
  onToken?: (token: number, logits: Float32Array) => boolean | void;
  /** Called when the sequence is admitted (gets its state and joins the passes). */
  onAdmit?: () => void;
  /** Prefill progress: tokens of `prompt` done so far, of `total`. */
  onPrefill?: (done: number, total: number) => void;
  /** Continue this state (its prefix already processed) instead of a fresh one. The
   * scheduler owns it from here: it is freed at the end unless `keepState`. */
  state?: SequenceState;
  /** Hand the state back in the result instead of freeing it. */
  keepState?: boolean;
  /** Recompute the whole sequence from an empty state for every token (a diagnostic:
   * gives the same tokens as carrying the state). */
  recompute?: boolean;
  /** Ends generation at the next pass boundary with finish reason "interrupted". */
  signal?: AbortSignal;
  /** Positions of `prompt` whose state the scheduler's state cache keeps (message
   * boundaries, prefixes other sequences share); used only with a cache. */
  cacheAt?: readonly number[];
  /** The ids that close the reply after its generated tokens (chat markup), so the cache
   * also keeps the state at prompt + reply + these; undefined: the reply is not kept. */
  replyTail?: (tokens: readonly number[], reason: FinishReason) => number[] | undefined;
  /** This sequence's speculation instead of the scheduler's (same tokens either way). */
  draft?: DraftOptions;
  /** The ids that follow `prompt` in the history a client sends back with the reply as it
   * was shown (content and tool calls, no reasoning), so the cache also keeps the state
   * there (prefilled after the reply from the longest kept prefix, in a free slot);
   * undefined: not kept. */
  historyReply?: (tokens: readonly number[], reason: FinishReason) => number[] | undefined;
  /** The choices of one prompt this sequence is one of (engine/generate/shared_prefill.ts):
   * the prompt is prefilled once for all of them. Ignored with `state` or `recompute`. */
  shared?: SharedPrefill;
}

/** A per-sequence constraint on the next token (engine/generate/grammar/mask.ts). */
export interface TokenFilter {
  /** Picks the next token with `choose` from `logits` (masking refused tokens in place), and
   * advances past it. */
  pick(logits: Float32Array, choose: (logits: Float32Array) => number): number;
}

/** What a finished sequence produced. */
export interface SequenceResult {
  /** The generated tokens, in order. */
  tokens: number[];
  /** Why generation ended. */
  finishReason: FinishReason;
  /** Tokens of the prompt (prefilled, or served from the state cache). */
  promptTokens: number;
  /** Tokens of the prompt served from the state cache instead of prefilled. */
  cachedTokens: number;
  /** From admission to the first token's logits (the whole prompt's prefill). */
  prefillSeconds: number;
  /** From the first token to the last. */
  decodeSeconds: number;
  /** Per generated token: the prefill for the first, then the time since the previous. */
  stepSeconds: number[];
  /** Speculation counters (when the sequence could draft). */
  draft?: DraftStats;
  /** The state after the last token (when `keepState`). Its position counts every token
   * that went through the model: the prompt and all generated tokens but the last. */
  state?: SequenceState;
}

/**
 * Refuses logits that are not all finite: weights that passed every shape and checksum
 * check can still hold NaN or Inf, and a token picked from them is not an answer (exit 4).
 */
export function checkFinite(logits: Float32Array, step: number): void {
  for (let i = 0; i < logits.length; i++) {
    if (!Number.isFinite(logits[i])) {
      throw new K3Error(
        `output unsound: logit ${i} is ${logits[i]} at step ${step} (NaN or Inf in the weights or activations)`,
        EXIT.unsound,
      );
    }
  }
}

/** A pass slower than this is not run only to close a reply for the state cache. */
export const CLOSE_ALONE_SECONDS = 1;

/** The fewest prompt rows a pass beside running decodes carries (the chunk before segments
 * grew), whatever the stall bound. */
export const MIN_PREFILL_ROWS = 16;

/** serve's bound on how long a prefill beside running decodes may hold them up, in seconds
 * (SchedulerOptions.maxStallSeconds). */
export const SERVE_MAX_STALL_SECONDS = 10;

/** Options of a scheduler. */
export interface SchedulerOptions {
  /** Sequences in flight at once (each holds a state). Default 1. */
  maxSequences?: number;
  /** Prompt tokens of one sequence per pass. Default: the model's row budget. */
  chunk?: number;
  /** Called after every pass with its segments (for progress and reports). */
  onPass?: (info: { rows: number; sequences: number; seconds: number }) => void;
  /** Exact-prefix state reuse: a sequence continues from the longest kept prefix of its
   * prompt and keeps its state at its `cacheAt` positions and after its reply. */
  cache?: StateCache;
  /** Speculative decoding (engine/generate/draft.ts). Default: suffix drafts where the
   * measured cost model says they pay. Tokens are the same in every mode. */
  draft?: DraftOptions;
  /** While a sequence decodes, the prompt rows of a pass are bounded so that the pass takes
   * about this many seconds at the measured seconds a prefill row (at least
   * MIN_PREFILL_ROWS rows); absent: a whole segment (`chunk`) however long. Where a prompt
   * is cut never changes a bit. */
  maxStallSeconds?: number;
}

/** The default speculation: suffix drafts, as many as the cost model says pay. */
export const DEFAULT_DRAFT: DraftOptions = Object.freeze({ mode: "suffix" });

/** A sequence in flight. */
class Running {
  readonly state: SequenceState;
  /** Tokens still to run through the model before the next logits. */
  pending: number[];
  readonly tokens: number[] = [];
  readonly stepSeconds: number[] = [];
  prefillDone = 0;
  /** Positions of the prompt restored from the state cache. */
  cachedTokens = 0;
  /** Prompt positions still to keep in the state cache, ascending. */
  keepAt: number[] = [];
  /** Only closes a finished reply for the state cache (no caller waits on it). */
  closing = false;
  /** Its kept state is being read from the state cache's spill directory: settles once it
   * has landed (in `landed`); the sequence joins passes only then. */
  landing?: Promise<void>;
  landed?: { hit?: CacheHit; error?: unknown };
  readonly admitted = performance.now();
  firstAt = 0;
  lastAt = 0;
  done = false;
  /** Its speculation, when it drafts. */
  policy?: DraftPolicy;
  /** It prefills its prompt for the other choices of its SharedPrefill. */
  leads = false;

  constructor(
    readonly req: SequenceRequest,
    state: SequenceState,
    readonly resolve: (r: SequenceResult) => void,
    readonly reject: (e: unknown) => void,
  ) {
    this.state = state;
    this.pending = [...req.prompt];
  }

  get decoding(): boolean {
    return this.tokens.length > 0 && !this.req.recompute;
  }
}

/** Generation for many sequences on one model; see the module doc. */
export class Scheduler {
  private readonly waiting: {
    req: SequenceRequest;
    resolve: (r: SequenceResult) => void;
    reject: (e: unknown) => void;
    /** Only keeps a state for the cache (historyReply): admitted after every request. */
    closing?: boolean;
  }[] = [];
  private readonly running: Running[] = [];
  private readonly maxSequences: number;
  private readonly chunk: number;
  private loop?: Promise<void>;
  private failure?: unknown;
  private lastPassSeconds = 0;
  /** Measured seconds a row of a prefill pass (the latest pass's; undefined: none yet). */
  private prefillRowSeconds?: number;
  private readonly draft: DraftOptions;
  /** The measured cost of drafted rows. */
  private readonly draftCost = new DraftCost();
  /** Recent finished sequences' texts, drafted from in suffix mode. */
  private readonly pool: SuffixPool;

  /** A scheduler over `model`; nothing runs until a sequence is submitted. */
  constructor(readonly model: K3Model, private readonly opts: SchedulerOptions = {}) {
    this.maxSequences = Math.max(1, Math.min(opts.maxSequences ?? 1, model.maxT));
    this.chunk = Math.max(1, Math.min(opts.chunk ?? model.maxT, model.maxT));
    this.draft = opts.draft ?? DEFAULT_DRAFT;
    this.pool = new SuffixPool();
  }

  /** Sequences waiting for a state slot. */
  get queued(): number {
    return this.waiting.length;
  }

  /** Sequences in flight. */
  get active(): number {
    return this.running.length;
  }

  /** Queues a sequence; resolves when it finishes, rejects (K3Error) when it fails. */
  submit(req: SequenceRequest): Promise<SequenceResult> {
    if (this.failure) return Promise.reject(this.failure);
    if (req.prompt.length === 0 && !req.state) return Promise.reject(new Error("scheduler: empty prompt"));
    if (req.recompute && req.state) return Promise.reject(new Error("scheduler: recompute starts from an empty state"));
    if (req.prompt.length === 0 && req.maxTokens > 0) {
      return Promise.reject(new Error("scheduler: nothing to prefill before the first token"));
    }
    const capacity = this.model.capacity;
    const need = (req.state?.pos ?? 0) + req.prompt.length + Math.max(0, req.maxTokens - 1);
    if (need > capacity) {
      return Promise.reject(
        new K3Error(`sequence needs ${need} positions; the model was opened for ${capacity}`),
      );
    }
    return new Promise((resolve, reject) => {
      this.waiting.push({ req, resolve, reject });
      if (!this.loop) {
        const loop: Promise<void> = this.run().finally(() => {
          if (this.loop === loop) this.loop = undefined;
        });
        this.loop = loop;
      }
    });
  }

  /** Waits until every submitted sequence has finished. */
  async close(): Promise<void> {
    while (this.loop) await this.loop;
  }

  /**
   * Moves waiting sequences into the running set while there is room. With a state cache,
   * a sequence starts from the longest kept prefix of its prompt, and one whose prefix a
   * running sequence is about to keep waits for it (a shared prefix is prefilled once).
   */
  private admit(): void {
    const cache = this.opts.cache;
    for (let i = 0; i < this.waiting.length && this.running.length < this.maxSequences;) {
      const { req, resolve, reject, closing } = this.waiting[i];
      if (closing && (this.waiting.some((w) => !w.closing) || cache?.has(req.prompt))) {
        // Requests go first; a state kept meanwhile needs no closing.
        if (cache?.has(req.prompt)) this.waiting.splice(i, 1);
        else i++;
        continue;
      }
      const role = req.shared && !req.state && !req.recompute ? req.shared.role() : undefined;
      if (role === "wait") {
        i++;
        continue;
      }
      const cached = cache && !req.state && !req.recompute && role !== "fork";
      const maxHit = req.maxTokens > 0 ? req.prompt.length - 1 : req.prompt.length;
      if (cached && this.prefixInFlight(req.prompt, cache.peek(req.prompt, maxHit), maxHit)) {
        i++;
        continue;
      }
      this.waiting.splice(i, 1);
      const seq = new Running(req, req.state ?? this.model.newState(), resolve, reject);
      seq.closing = closing === true;
      const draft = req.draft ?? this.draft;
      if (draft.mode !== "off" && !req.recompute) {
        const drafter = new SequenceDrafter(draft, draft.mode === "suffix" ? this.pool : undefined);
        drafter.append(req.prompt);
        seq.policy = new DraftPolicy(drafter, draft);
      }
      if (role === "lead") (seq.leads = true, req.shared!.lead());
      this.running.push(seq);
      if (role === "fork") {
        req.onAdmit?.();
        this.fork(seq, req.shared!.prefilled!);
        req.shared!.started();
        continue;
      }
      if (cached) {
        const t0 = performance.now();
        let found: ReturnType<StateCache["find"]>;
        try {
          found = cache.find(req.prompt, maxHit, !closing);
        } catch (e) {
          this.fail(seq, e);
          continue;
        } finally {
          this.model.ledger.stateCache += (performance.now() - t0) / 1000;
        }
        req.onAdmit?.();
        if (found instanceof Promise) {
          // A spill file being read: the pass loop goes on with the other sequences, and
          // this one starts once its state has landed (run() applies it between passes).
          seq.landing = found.then((hit) => void (seq.landed = { hit }), (error) => void (seq.landed = { error }));
          continue;
        }
        this.start(seq, found);
        continue;
      }
      req.onAdmit?.();
      if (seq.pending.length === 0) this.finish(seq, "length"); // a state handed back as is
    }
  }

  /** Starts an admitted cached sequence from `hit` (its kept prefix, if any). */
  private start(seq: Running, hit: CacheHit | undefined): void {
    const req = seq.req;
    if (hit) {
      const t0 = performance.now();
      seq.state.restore(hit.payload, hit.length);
      seq.cachedTokens = hit.length;
      if (!seq.closing) this.model.ledger.cachedTokens += hit.length;
      seq.pending = req.prompt.slice(hit.length);
      this.model.ledger.stateCache += (performance.now() - t0) / 1000;
    }
    seq.keepAt = [...new Set(req.cacheAt ?? [])]
      .filter((p) => Number.isInteger(p) && p > seq.cachedTokens && p <= req.prompt.length)
      .sort((a, b) => a - b);
    if (seq.pending.length === 0) this.finish(seq, "length"); // a state handed back as is
  }

  /** Starts a choice from the prompt its SharedPrefill's leader prefilled: a copy of the
   * state, its first token picked from a copy of the prompt's last logits. */
  private fork(seq: Running, prefilled: Prefilled): void {
    seq.state.restore(prefilled.state, prefilled.pos);
    seq.pending = [];
    seq.prefillDone = prefilled.pos;
    seq.req.onPrefill?.(prefilled.pos, seq.req.prompt.length);
    try {
      this.step(seq, Float32Array.from(prefilled.logits), performance.now());
    } catch (e) {
      this.fail(seq, e);
    }
  }

  /** Starts the sequences whose kept state has landed from disk since the last pass. */
  private startLanded(): void {
    for (const seq of [...this.running]) {
      if (!seq.landing || !seq.landed) continue;
      const { hit, error } = seq.landed;
      seq.landing = seq.landed = undefined;
      if (seq.done) continue;
      if (error !== undefined) this.fail(seq, error);
      else this.start(seq, hit);
    }
  }

  /** True when a running sequence will keep a state of `ids`' first p positions,
   * `have` < p <= `upTo`: waiting for it beats prefilling the same prefix twice. */
  private prefixInFlight(ids: readonly number[], have: number, upTo: number): boolean {
    for (const r of this.running) {
      for (const p of r.keepAt) {
        if (p <= have || p > upTo || r.req.prompt.length < p) continue;
        let same = true;
        for (let j = 0; j < p && same; j++) same = r.req.prompt[j] === ids[j];
        if (same) return true;
      }
    }
    return false;
  }

  /**
   * After a reply, runs its last token and `replyTail` ids through its state and keeps the
   * result in the cache (the state the next turn of the conversation starts from). True
   * when the state went to that closing sequence (which frees it).
   */
  private closeReply(seq: Running, reason: FinishReason): boolean {
    const cache = this.opts.cache, req = seq.req;
    if (!cache || seq.closing || !req.replyTail || req.recompute || req.state || reason === "interrupted") return false;
    if (seq.tokens.length === 0 || seq.state.pos !== req.prompt.length + seq.tokens.length - 1) return false;
    const tail = req.replyTail(seq.tokens, reason);
    if (!tail) return false;
    const key = [...req.prompt, ...seq.tokens, ...tail];
    if (key.length > this.model.capacity || cache.has(key)) return false;
    const closer = new Running({ prompt: key, maxTokens: 0 }, seq.state, () => {}, () => {});
    closer.closing = true;
    closer.pending = [seq.tokens[seq.tokens.length - 1], ...tail];
    closer.keepAt = [key.length];
    this.running.push(closer);
    return true;
  }

  /**
   * After a reply, queues a sequence that keeps the state of the prompt followed by
   * `historyReply`'s ids (the reply as a client sends it back without its reasoning): it
   * continues from the longest kept prefix (the prompt's, at least its last message) and
   * runs in a slot no request wants.
   */
  private closeHistory(seq: Running, reason: FinishReason): void {
    const cache = this.opts.cache, req = seq.req;
    if (!cache || seq.closing || !req.historyReply || req.recompute || req.state || reason === "interrupted") return;
    const tail = req.historyReply(seq.tokens, reason);
    if (!tail || tail.length === 0) return;
    const key = [...req.prompt, ...tail];
    if (key.length > this.model.capacity || cache.has(key)) return;
    const same = (ids: readonly number[]) => ids.length === key.length && ids.every((t, i) => t === key[i]);
    if (this.running.some((r) => r.closing && same(r.req.prompt))) return; // the reply's own closing keeps it
    const done = () => {};
    this.waiting.push({
      req: { prompt: key, maxTokens: 0, cacheAt: [key.length] },
      resolve: done,
      reject: done,
      closing: true,
    });
  }

  /** Ends a sequence with `reason` and resolves its promise. */
  private finish(seq: Running, reason: FinishReason): void {
    if (seq.done) return;
    seq.done = true;
    if (seq.leads) seq.req.shared!.leaderGone();
    this.running.splice(this.running.indexOf(seq), 1);
    const now = performance.now();
    const result: SequenceResult = {
      tokens: seq.tokens,
      finishReason: reason,
      promptTokens: seq.req.prompt.length,
      cachedTokens: seq.cachedTokens,
      prefillSeconds: ((seq.firstAt || now) - seq.admitted) / 1000,
      decodeSeconds: seq.firstAt ? (seq.lastAt - seq.firstAt) / 1000 : 0,
      stepSeconds: seq.stepSeconds,
    };
    if (seq.policy) {
      result.draft = { ...seq.policy.stats };
      if (seq.policy.drafter.mode === "suffix") this.pool.add(seq.policy.drafter.text);
    }
    if (seq.req.keepState) result.state = seq.state;
    else if (!this.keepReply(seq, reason)) seq.state.free();
    seq.resolve(result);
  }

  /**
   * Hands `seq`'s finished reply to the state cache (closeReply, closeHistory): true when
   * its state went to a closing sequence. Best effort: a reply the callbacks cannot read
   * (ids the tokenizer does not know) loses only its kept state, never its result.
   */
  private keepReply(seq: Running, reason: FinishReason): boolean {
    let kept = false;
    try {
      kept = this.closeReply(seq, reason);
      this.closeHistory(seq, reason);
    } catch {
      // The finished sequence is already out of the running set: throwing here would
      // leave its caller waiting forever.
    }
    return kept;
  }

  /** Ends a sequence with an error and rejects its promise. */
  private fail(seq: Running, e: unknown): void {
    if (seq.done) return;
    seq.done = true;
    if (seq.leads) seq.req.shared!.leaderGone();
    this.running.splice(this.running.indexOf(seq), 1);
    seq.state.free();
    seq.reject(e);
  }

  /** The next pass: every decoding sequence's token, then prefill chunks while rows remain. */
  private nextPass(): { seq: Running; seg: Segment }[] {
    const pass: { seq: Running; seg: Segment }[] = [];
    let rows = 0;
    const decoders = this.running.filter((seq) => seq.decoding);
    // Drafts share the rows the decode tokens leave, before any prefill chunk. A pass
    // wants a row of logits per decode token and draft and per prompt ending in it: at most
    // its rows, so only a model holding fewer logit rows than rows (long segments) keeps
    // one logit row for every running sequence's last row and the rest for drafts.
    const { maxT, logitRows } = this.model;
    let draftRows = Math.min(maxT - decoders.length, logitRows >= maxT ? Infinity : logitRows - this.running.length);
    for (const seq of decoders) {
      const ids = seq.pending.splice(0);
      const room = Math.min(
        draftRows,
        seq.req.maxTokens - seq.tokens.length - 1,
        seq.state.capacity - seq.state.pos - ids.length,
      );
      const draft = seq.policy?.next(room, this.draftCost.relative) ?? [];
      draftRows -= draft.length;
      const seg: Segment = draft.length > 0
        ? { state: seq.state, ids: [...ids, ...draft], logits: "all", speculative: true }
        : { state: seq.state, ids, logits: "last" };
      pass.push({ seq, seg });
      rows += seg.ids.length;
    }
    // Prompt rows beside running decodes: as many as the stall bound allows.
    let prefillRoom = decoders.length > 0 ? this.stallRows() : Infinity;
    for (const seq of this.running) {
      if (seq.decoding || seq.landing) continue;
      // The states to keep inside the pass are taken on its way, as many as the state
      // cache's RAM budget holds (at least one); the pass ends at the next (chunking never
      // changes a bit).
      const inPass = this.keepsInPass(seq);
      const keep = seq.keepAt.length > inPass ? seq.keepAt[inPass] - seq.state.pos : Infinity;
      const n = Math.min(seq.pending.length, this.chunk, this.model.maxT - rows, keep, prefillRoom);
      prefillRoom -= Math.max(0, n);
      if (n <= 0) continue;
      seq.state.keepDuringPass(seq.keepAt.filter((p) => p <= seq.state.pos + n));
      const ids = seq.pending.splice(0, n);
      const last = seq.pending.length === 0 && seq.req.maxTokens > 0;
      pass.push({ seq, seg: { state: seq.state, ids, logits: last ? "last" : "none" } });
      rows += n;
    }
    return pass;
  }

  /** How many of `seq`'s next kept states one pass may take on its way: their snapshots
   * are held until it ends, so as many as fit the state cache's RAM budget, at least one. */
  private keepsInPass(seq: Running): number {
    const budget = this.opts.cache?.opts.ramBytes ?? 0;
    let n = 0, bytes = 0;
    for (const p of seq.keepAt) {
      bytes += seq.state.snapshotBytes(p);
      if (n > 0 && bytes > budget) break;
      n++;
    }
    return n;
  }

  /** Prompt rows a pass beside running decodes may carry (SchedulerOptions.maxStallSeconds). */
  private stallRows(): number {
    const limit = this.opts.maxStallSeconds;
    if (limit === undefined) return Infinity;
    const perRow = this.prefillRowSeconds;
    return Math.max(MIN_PREFILL_ROWS, perRow ? Math.floor(limit / perRow) : 0);
  }

  /** The pass loop: runs until no sequence is waiting or running. */
  private async run(): Promise<void> {
    // Never finish synchronously: the caller stores this loop before it can end.
    await Promise.resolve();
    while (this.waiting.length > 0 || this.running.length > 0) {
      // A pass on resident weights may never leave the microtask queue; when a sequence
      // can be aborted, let the signal handlers and I/O (macrotasks: a k3 serve client's
      // disconnect, its streamed chunks) run between passes, and so must the reads of a
      // kept state landing from disk. setImmediate costs ~20 us here, setTimeout(0) ~1-3 ms
      // (a pass of the tiny model is ~1 ms).
      if (
        this.running.some((s) => s.req.signal || s.landing) || this.waiting.some((w) => w.req.signal)
      ) {
        await new Promise((r) => setImmediate(r));
      }
      this.admit();
      this.startLanded();
      for (const seq of [...this.running]) if (seq.req.signal?.aborted) this.finish(seq, "interrupted");
      // A reply's closing ids ride along with other work for free; alone they cost a whole
      // pass (at the floor budget, a read of the streamed trunk), paid only while passes
      // are cheap. Dropping them loses only the reply's kept state, never a token.
      if (
        this.waiting.every((w) => w.closing) && this.running.every((s) => s.closing) &&
        this.running.length + this.waiting.length > 0 && this.lastPassSeconds > CLOSE_ALONE_SECONDS
      ) {
        for (const seq of [...this.running]) this.finish(seq, "length");
        this.waiting.length = 0;
        continue;
      }
      const pass = this.nextPass();
      if (pass.length === 0) {
        const landing = this.running.filter((seq) => seq.landing).map((seq) => seq.landing!);
        if (landing.length > 0) await Promise.race(landing); // nothing else to compute
        else if (this.running.length > 0) throw new Error("internal: scheduler built an empty pass");
        continue;
      }
      const t0 = performance.now();
      let logits: Float32Array[];
      try {
        logits = await this.model.pass(pass.map((p) => p.seg));
      } catch (e) {
        // A failed pass (a bad read, a refused trunk) ends every sequence: their states
        // are mid-layer and nothing computed after it could be trusted.
        this.failure = e;
        for (const seq of [...this.running]) this.fail(seq, e);
        for (const w of this.waiting.splice(0)) w.reject(e);
        return;
      }
      const now = performance.now();
      const rows = pass.reduce((n, p) => n + p.seg.ids.length, 0);
      this.lastPassSeconds = (now - t0) / 1000;
      this.opts.onPass?.({ rows, sequences: pass.length, seconds: (now - t0) / 1000 });
      const prefilling = pass.some((p) => !p.seq.decoding);
      if (prefilling) {
        this.opts.cache?.notePrefillPass((now - t0) / 1000, rows);
        this.prefillRowSeconds = (now - t0) / 1000 / rows;
      }
      this.model.ledger[prefilling ? "prefillPassSeconds" : "decodePassSeconds"] += (now - t0) / 1000;
      this.model.ledger[prefilling ? "prefillPassRows" : "decodePassRows"] += rows;
      if (pass.every((p) => p.seq.decoding)) this.draftCost.observe((now - t0) / 1000, rows - pass.length);
      pass.forEach(({ seq, seg }, i) => {
        if (seq.done) return;
        if (!seq.decoding && seq.tokens.length === 0) {
          seq.prefillDone += seg.ids.length;
          seq.req.onPrefill?.(Math.min(seq.prefillDone, seq.req.prompt.length), seq.req.prompt.length);
          this.keep(seq);
        }
        if (seg.logits === "none") {
          if (seq.pending.length === 0) this.finish(seq, "length"); // prompt only
          return;
        }
        if (seq.leads) this.publish(seq, logits[i]);
        try {
          if (seg.speculative) this.stepDrafted(seq, seg, logits[i], now);
          else this.step(seq, logits[i], now);
        } catch (e) {
          this.fail(seq, e);
        }
      });
    }
    // Cleared here, synchronously: a caller resumed by the last finish may submit again
    // before this promise settles, and must start a new loop rather than wait on this one.
    this.loop = undefined;
  }

  /** The leader of a SharedPrefill has prefilled its prompt: the other choices fork from a
   * copy of its state and `logits` (copied before its own filter masks them). */
  private publish(seq: Running, logits: Float32Array): void {
    const shared = seq.req.shared!;
    if (shared.awaited) {
      shared.publish({ state: seq.state.snapshot(), pos: seq.state.pos, logits: Float32Array.from(logits) });
    }
    shared.started();
    seq.leads = false;
  }

  /** Puts the states `seq`'s last pass took on its way (its `keepAt` positions) in the cache. */
  private keep(seq: Running): void {
    const t0 = performance.now();
    for (const { pos, payload } of seq.state.takeKept()) {
      seq.keepAt.shift();
      this.opts.cache!.put(seq.req.prompt.slice(0, pos), payload);
    }
    this.model.ledger.stateCache += (performance.now() - t0) / 1000;
  }

  /** Picks and hands out one token of `seq`; ends it or queues the token for the next pass. */
  private step(seq: Running, logits: Float32Array, now: number): void {
    const { req } = seq;
    const reason = this.emit(seq, logits, now);
    if (reason) return this.finish(seq, reason);
    const token = seq.tokens[seq.tokens.length - 1];
    if (req.recompute) {
      seq.state.reset();
      seq.pending = [...req.prompt, ...seq.tokens];
    } else {
      seq.pending = [token];
    }
  }

  /**
   * After a pass that verified a draft: row i's logits give the token of position i, picked
   * by the sequence's own `choose` exactly as plain decoding would (once per emitted token);
   * row i + 1 is valid while the draft token there equals the token emitted at i. The state
   * keeps the rows up to the first mismatch, and the last emitted token is the next pending.
   */
  private stepDrafted(seq: Running, seg: Segment, logits: Float32Array, now: number): void {
    const V = this.model.cfg.vocabSize, drafted = seg.ids.length - 1;
    let kept = 0, accepted = 0, reason: FinishReason | undefined;
    for (let i = 0; i <= drafted; i++) {
      kept++;
      reason = this.emit(seq, logits.subarray(i * V, (i + 1) * V), now);
      const match = i < drafted && seq.tokens[seq.tokens.length - 1] === seg.ids[i + 1];
      if (match) accepted++;
      if (reason || !match) break;
    }
    this.model.keepPrefix(seq.state, kept);
    seq.policy!.record(drafted, accepted);
    if (reason) return this.finish(seq, reason);
    seq.pending = [seq.tokens[seq.tokens.length - 1]];
  }

  /** Picks one token of `seq` from `logits` and hands it out; says why the sequence ends
   * with it, if it does. */
  private emit(seq: Running, logits: Float32Array, now: number): FinishReason | undefined {
    const { req } = seq;
    checkFinite(logits, seq.tokens.length);
    const t0 = performance.now();
    const choose = req.choose ?? argmax;
    const token = req.grammar ? req.grammar.pick(logits, choose) : choose(logits);
    this.model.ledger.sampling += (performance.now() - t0) / 1000;
    seq.stepSeconds.push((now - (seq.lastAt || seq.admitted)) / 1000);
    seq.firstAt ||= now;
    seq.lastAt = now;
    seq.tokens.push(token);
    seq.policy?.drafter.append([token]);
    const stopByCaller = req.onToken?.(token, logits) === true;
    if (stopByCaller || req.stopIds?.includes(token)) return "stop";
    if (seq.tokens.length >= req.maxTokens) return "length";
    if (req.signal?.aborted) return "interrupted";
    return undefined;
  }
}
