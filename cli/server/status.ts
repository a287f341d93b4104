/**
 * `GET /v1/status/stream`: the engine, live, as server-sent events for the chat page's
 * panel (docs/web.md). Three events: `plan` once (the memory plan as one bar's parts),
 * `status` on every change (the queue, the sequences in flight with their prefill
 * progress, the state cache's counters) and `pass` after every forward pass (its seconds
 * split into read waits and compute from the model's ledger, bytes read, expert hits, and
 * the tokens it gave each sequence).
 *
 * What a subscriber sees of a sequence depends on who asked for it: every sequence is
 * tagged with its owner (a digest of the API key its request carried; "" without
 * `--api-key`), and a subscriber gets the details (id, progress, tokens) of its own
 * owner's sequences only; of the others it gets counts. Engine-wide numbers (the plan,
 * pass timings, bytes, hits) are the same for everyone.
 *
 * @module
 */

import type { MemoryPlan } from "../../engine/weights/plan.ts";
import { ledgerBetween, type LedgerMark } from "../../engine/generate/ledger.ts";
import type { StateCacheStats } from "../../engine/generate/state_cache.ts";

/** What the hub reads from the engine. */
export interface StatusSource {
  /** The memory plan the model was opened with. */
  plan: MemoryPlan;
  /** The ledger and I/O counters now (engine/generate/ledger.ts `markLedger`). */
  mark: () => LedgerMark;
  /** Sequences waiting for a slot and in flight (the scheduler's). */
  queue: () => { queued: number; active: number };
  /** The state cache's counters (undefined: no cache). */
  stateCache?: () => StateCacheStats;
}

/** One part of the memory bar. */
export interface MemoryPart {
  /** What holds the bytes. */
  name: "trunk pinned" | "ring" | "expert cache" | "state cache" | "sequence states" | "other" | "free";
  /** Bytes planned for it. */
  bytes: number;
}

/** The `plan` event: the memory plan as one bar. */
export interface PlanEvent {
  /** Bytes the process may use (null: unknown, then there is no `free` part). */
  available_bytes: number | null;
  /** The plan's total. */
  total_bytes: number;
  /** Resident or streamed weights. */
  mode: string;
  /** The parts, in the bar's order. */
  parts: MemoryPart[];
}

/** A sequence as its owner sees it in a `status` event. */
export interface SequenceView {
  /** The request's id (chatcmpl-..., cmpl-..., resp_...). */
  id: string;
  /** Waiting for a slot, reading its prompt, or generating. */
  phase: "queued" | "prefill" | "decode";
  /** Tokens of its prompt. */
  prompt_tokens: number;
  /** Prompt tokens read so far (the scheduler's progress). */
  prefilled: number;
  /** Seconds the rest of the prompt should take at the rate so far (null: no rate yet). */
  eta_seconds: number | null;
  /** The layer the prefill is in (null: the scheduler reports tokens, not layers, yet). */
  layer: number | null;
  /** Tokens generated so far. */
  generated: number;
}

/** The `status` event. */
export interface StatusEvent {
  /** Sequences waiting for a slot (everyone's). */
  queued: number;
  /** Sequences in flight (everyone's). */
  active: number;
  /** This subscriber's own sequences. */
  sequences: SequenceView[];
  /** Sequences of other API keys, counted only. */
  other_sequences: number;
  /** The state cache's counters (null: no cache). */
  state_cache: StateCacheStats | null;
  /** Forward passes run since the server started. */
  passes: number;
}

/** The `pass` event: one forward pass. */
export interface PassEvent {
  /** Its number (1, 2, ...). */
  pass: number;
  /** Rows (tokens) it carried. */
  rows: number;
  /** Wall seconds of the pass. */
  seconds: number;
  /** Seconds waiting for trunk reads (ledger, since the pass before). */
  trunk_read_wait_seconds: number;
  /** Seconds waiting for expert reads. */
  expert_read_wait_seconds: number;
  /** Seconds computing: dense and expert products, attention, head, sampling. */
  compute_seconds: number;
  /** Trunk bytes read. */
  trunk_bytes: number;
  /** Expert bytes read. */
  expert_bytes: number;
  /** Expert lookups served from the expert cache. */
  expert_hits: number;
  /** Expert lookups read from disk. */
  expert_misses: number;
  /** This subscriber's sequences that got a token from the pass, with the token's number. */
  tokens: { id: string; index: number }[];
  /** This subscriber's sequences that read prompt tokens in the pass. */
  prefill: { id: string; done: number; total: number }[];
  /** Sequences of other API keys in the pass, counted only. */
  other_sequences: number;
}

/** What a request reports about its sequence as it runs. */
export interface SequenceWatch {
  /** The sequence got a state slot. */
  admitted(): void;
  /** `done` of `total` prompt tokens read. */
  prefill(done: number, total: number): void;
  /** A token was generated. */
  token(): void;
  /** The sequence ended (any way). */
  end(): void;
}

/** A sequence the hub follows. */
interface Followed {
  id: string;
  owner: string;
  phase: SequenceView["phase"];
  promptTokens: number;
  prefilled: number;
  prefillStart: number;
  generated: number;
}

/** A subscriber: its owner and where its events go. */
interface Subscriber {
  owner: string;
  send: (event: string, data: unknown) => void;
}

/** The memory plan as the bar's parts: what the plan names, the rest as other, then free. */
export function memoryParts(plan: MemoryPlan): PlanEvent {
  const named: MemoryPart[] = [
    { name: "trunk pinned", bytes: plan.trunk.pinnedBytes },
    { name: "ring", bytes: plan.trunk.ringBytes },
    { name: "expert cache", bytes: plan.experts.resident ? 0 : plan.experts.bytes },
    { name: "state cache", bytes: plan.stateCache?.bytes ?? 0 },
    { name: "sequence states", bytes: plan.state.bytes + (plan.speculation?.bytes ?? 0) },
  ];
  const namedBytes = named.reduce((a, p) => a + p.bytes, 0);
  const parts = [...named, { name: "other" as const, bytes: Math.max(0, plan.totalBytes - namedBytes) }];
  if (plan.availableBytes !== null) {
    parts.push({ name: "free", bytes: Math.max(0, plan.availableBytes - plan.totalBytes) });
  }
  return { available_bytes: plan.availableBytes, total_bytes: plan.totalBytes, mode: plan.mode, parts };
}

/** The sequences the engine runs for the status stream, and its subscribers. */
export class StatusHub {
  readonly #source: StatusSource;
  readonly #sequences = new Map<string, Followed>();
  readonly #subscribers = new Set<Subscriber>();
  #last: LedgerMark;
  #passes = 0;
  /** The pass just run, filled with the tokens and prefill its sequences report. */
  #pass?: {
    info: { rows: number; seconds: number };
    mark: LedgerMark;
    tokens: { seq: Followed; index: number }[];
    prefill: Followed[];
  };

  /** A hub reading `source`; nothing is sent until someone subscribes. */
  constructor(source: StatusSource) {
    this.#source = source;
    this.#last = source.mark();
  }

  /** Subscribes `send` for `owner`: the plan and a status at once, then every change;
   * returns the unsubscribe. */
  subscribe(owner: string, send: (event: string, data: unknown) => void): () => void {
    const sub = { owner, send };
    this.#subscribers.add(sub);
    send("plan", memoryParts(this.#source.plan));
    send("status", this.#status(owner));
    return () => this.#subscribers.delete(sub);
  }

  /** The scheduler's `onPass` hook: records the pass; its event goes out once the pass's
   * tokens are handed out (they follow synchronously, before the next await). */
  onPass = (info: { rows: number; sequences: number; seconds: number }): void => {
    this.#passes++;
    this.#pass = { info, mark: this.#source.mark(), tokens: [], prefill: [] };
    queueMicrotask(() => this.#flushPass());
  };

  /** Follows the sequence of request `id` submitted by `owner`, queued until admitted. */
  watch(id: string, owner: string, promptTokens: number): SequenceWatch {
    const seq: Followed = {
      id,
      owner,
      phase: "queued",
      promptTokens,
      prefilled: 0,
      prefillStart: 0,
      generated: 0,
    };
    this.#sequences.set(id, seq);
    this.#changed();
    return {
      admitted: () => {
        seq.phase = "prefill";
        seq.prefillStart = performance.now();
        this.#changed();
      },
      prefill: (done, total) => {
        seq.prefilled = done;
        seq.promptTokens = total;
        this.#pass?.prefill.push(seq);
      },
      token: () => {
        seq.phase = "decode";
        seq.generated++;
        this.#pass?.tokens.push({ seq, index: seq.generated });
      },
      end: () => {
        if (this.#sequences.delete(id)) this.#changed();
      },
    };
  }

  /** Sends the pass just run to every subscriber, then the status it left. */
  #flushPass(): void {
    const p = this.#pass;
    if (!p) return;
    this.#pass = undefined;
    const l = ledgerBetween(this.#last, p.mark);
    const hits = (p.mark.io?.expertHits ?? 0) - (this.#last.io?.expertHits ?? 0);
    const misses = (p.mark.io?.expertMisses ?? 0) - (this.#last.io?.expertMisses ?? 0);
    this.#last = p.mark;
    const pass = this.#passes;
    const common = {
      pass,
      rows: p.info.rows,
      seconds: p.info.seconds,
      trunk_read_wait_seconds: l.trunk_read_wait_seconds,
      expert_read_wait_seconds: l.expert_read_wait_seconds,
      compute_seconds: l.dense_matmul_seconds + l.expert_compute_seconds + l.attention_seconds + l.head_seconds +
        l.sampling_seconds,
      trunk_bytes: l.trunk_bytes_read,
      expert_bytes: l.expert_bytes_read,
      expert_hits: hits,
      expert_misses: misses,
    };
    for (const sub of this.#subscribers) {
      const own = (s: Followed) => s.owner === sub.owner;
      const others = new Set([...p.tokens.map((t) => t.seq), ...p.prefill].filter((s) => !own(s)));
      const event: PassEvent = {
        ...common,
        tokens: p.tokens.filter((t) => own(t.seq)).map((t) => ({ id: t.seq.id, index: t.index })),
        prefill: p.prefill.filter(own).map((s) => ({ id: s.id, done: s.prefilled, total: s.promptTokens })),
        other_sequences: others.size,
      };
      sub.send("pass", event);
      sub.send("status", this.#status(sub.owner));
    }
  }

  /** Sends the status to every subscriber (a sequence came or went). */
  #changed(): void {
    for (const sub of this.#subscribers) sub.send("status", this.#status(sub.owner));
  }

  /** The status as `owner` sees it. */
  #status(owner: string): StatusEvent {
    const now = performance.now();
    const mine = [...this.#sequences.values()].filter((s) => s.owner === owner);
    const { queued, active } = this.#source.queue();
    return {
      queued,
      active,
      sequences: mine.map((s) => {
        const elapsed = (now - s.prefillStart) / 1000;
        const rate = s.phase === "prefill" && s.prefilled > 0 ? s.prefilled / elapsed : 0;
        return {
          id: s.id,
          phase: s.phase,
          prompt_tokens: s.promptTokens,
          prefilled: s.prefilled,
          eta_seconds: rate > 0 ? (s.promptTokens - s.prefilled) / rate : null,
          layer: null,
          generated: s.generated,
        };
      }),
      other_sequences: this.#sequences.size - mine.length,
      state_cache: this.#source.stateCache?.() ?? null,
      passes: this.#passes,
    };
  }
}
