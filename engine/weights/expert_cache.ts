/**
 * The routed-expert cache: a fixed set of aligned slots allocated once at start-up, LRU
 * replacement, whole-expert reads.
 *
 * `take(L, ids)` claims experts of one layer for one forward pass: hits are marked held
 * first; then missing experts get a slot while one is free (empty, or the least recently used
 * one that is neither held nor loading) and all those reads are issued together in file-offset order,
 * O_DIRECT where the filesystem allows (one read per expert when its six tensors are
 * contiguous, rounded out to 4096: the slot has room). A second request for an expert
 * still being read waits for that read. A slot is published (usable, findable by a later
 * call as a hit) only after its read completed in full; a failed or short read frees the
 * slot and stops the run with a K3Error naming the layer and the expert (exit 1: we never
 * compute a token without every expert it routed to). Slots held by layer L are not
 * evicted until `release(L)` or `release(L, ids)` (the forward pass's doneWithExperts, per
 * expert as soon as it has run); `whenRoom` says when a read settles, so the pass can claim
 * the rest. `prefetch(L, ids)` reads a guess into the slots free now, held by no layer: a later
 * `take` finds it as a hit (waiting for its read if it is still in flight), and a wrong guess
 * is simply the least recently used slot. `get` and `fetch` take all of `ids` or refuse.
 *
 * With an expert table (expert_table.ts) every expert read carries its table digest
 * (Expert.check), settled by its first run: its MXFP4 products add up its tensor checks from
 * the bytes they decode, and a mismatch is one K3Error (exit 1, as a trunk mismatch) naming
 * the layer, the expert and the shard before anything computed from the expert goes on. A
 * slot stays verified while it holds the same expert.
 *
 * K3_FAULT_EXPERT_READ=L:E (tests only) makes the read of expert E of layer L come up short;
 * K3_TEST_EXPERT_SHUFFLE=SEED (tests only) hands each expert out after a random delay of 0 to
 * 4 ms drawn from SEED, hits too, so the experts of a layer land in a shuffled order.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { K3Error } from "../errors.ts";
import { type ExpertLocation, expertView, locateExpert } from "./experts.ts";
import type { Kernels } from "../native/ffi.ts";
import { IoFile } from "../native/io.ts";
import { expertCheck, type ExpertTable, readExpertSlot, tableDigest } from "./expert_table.ts";
import { NativeBuffer } from "../native/memory.ts";
import { testHook } from "../native/test_hooks.ts";
import type { IoStats } from "../model/weight_source.ts";
import type { Checkpoint } from "./safetensors.ts";
import type { Expert } from "../native/tensors.ts";

interface Slot {
  buf: NativeBuffer;
  key: number;
  state: "empty" | "loading" | "ready";
  /** Layer holding it (until release), or -1. */
  holder: number;
  view?: Expert;
  loading?: Promise<void>;
  /** Read ahead on a guess and not taken yet. */
  guessed?: boolean;
}

/** Routed experts in aligned slots allocated once: LRU, one read per expert, reads shared while in flight. */
export class ExpertCache {
  private readonly slots: Slot[] = [];
  /** key -> slot index, in recency order (oldest first). */
  private readonly lru = new Map<number, number>();
  private readonly locs = new Map<number, ExpertLocation>();
  private readonly direct = new Map<string, IoFile>();
  private readonly buffered = new Map<string, IoFile>();
  private readonly fault?: [number, number];
  /** K3_TEST_EXPERT_SHUFFLE: each expert handed out after a seeded random delay. */
  private readonly shuffle?: <T>(p: Promise<T>) => Promise<T>;

  /**
   * A cache of `nslots` slots of `slotBytes` each, allocated now, filled from the
   * checkpoint's shards; with `table`, every read is verified against it.
   */
  constructor(
    k: Kernels,
    private readonly cfg: K3Config,
    private readonly ckpt: Checkpoint,
    nslots: number,
    slotBytes: number,
    private readonly stats: IoStats,
    private readonly table?: { table: ExpertTable; path: string },
  ) {
    try {
      for (let i = 0; i < nslots; i++) {
        this.slots.push({
          buf: NativeBuffer.alloc(k, slotBytes, "expert slot"),
          key: -1,
          state: "empty",
          holder: -1,
        });
      }
    } catch (e) {
      this.slots.forEach((s) => s.buf.free());
      throw e;
    }
    const f = testHook("K3_FAULT_EXPERT_READ")?.match(/^(\d+):(\d+)$/);
    if (f) this.fault = [Number(f[1]), Number(f[2])];
    const seed = testHook("K3_TEST_EXPERT_SHUFFLE");
    if (seed !== undefined) this.shuffle = landInShuffledOrder(Number(seed) || 1);
  }

  /** Slots in the cache. */
  get size(): number {
    return this.slots.length;
  }

  /** Where expert `E` of layer `L` is on disk. */
  private loc(L: number, E: number): ExpertLocation {
    const key = L * this.cfg.moe.numExperts + E;
    let l = this.locs.get(key);
    if (!l) this.locs.set(key, l = locateExpert(this.cfg, this.ckpt, L, E));
    return l;
  }

  /** The open file of a shard (opened once). */
  private file(path: string, direct: boolean): IoFile {
    const m = direct ? this.direct : this.buffered;
    let f = m.get(path);
    if (!f) m.set(path, f = IoFile.open(path, { direct }));
    return f;
  }

  /** A free slot: an empty one, else the least recently used that is not held. */
  private victim(): number {
    const empty = this.slots.findIndex((s) => s.state === "empty");
    if (empty >= 0) return empty;
    for (const [key, i] of this.lru) {
      const s = this.slots[i];
      if (s.holder < 0 && s.state === "ready") {
        this.lru.delete(key);
        return i;
      }
    }
    return -1;
  }

  /** Settles when a read in flight settles (room may have freed up); undefined when none is. */
  whenRoom(): Promise<void> | undefined {
    const loading = this.slots.filter((s) => s.state === "loading").map((s) => s.loading!.then(() => {}, () => {}));
    return loading.length > 0 ? Promise.race(loading) : undefined;
  }

  /** Experts `ids` of layer L, in order, once all are in memory; held until release(L). */
  async get(L: number, ids: number[]): Promise<Expert[]> {
    const t0 = performance.now();
    const done = await Promise.allSettled(this.fetch(L, ids));
    this.stats.ioWaitSeconds += (performance.now() - t0) / 1000;
    const failed = done.find((d) => d.status === "rejected") as PromiseRejectedResult | undefined;
    if (failed) throw failed.reason;
    return done.map((d) => (d as PromiseFulfilledResult<Expert>).value);
  }

  /**
   * Experts `ids` of layer L, one promise each, in order (see `take`); throws when the
   * cache cannot hold them all at once.
   */
  fetch(L: number, ids: number[]): Promise<Expert>[] {
    const taken = this.take(L, ids);
    const missing = ids.filter((E) => !taken.has(E));
    if (missing.length > 0) {
      // What was claimed stays held (its reads are in flight) until release(L), as always.
      throw new Error(
        `internal: expert cache of ${this.slots.length} slots cannot hold layer ${L}'s ${ids.length} experts`,
      );
    }
    return ids.map((E) => taken.get(E)!);
  }

  /**
   * Claims experts of layer L among `ids`: every one in the cache or being read (a hit, held
   * at once) and, in `ids` order, as many of the others as there is room for, their reads
   * all issued before this returns, in file order. Returns the claimed ones, hits first, each
   * a promise that settles when it is in memory (hits at once, misses when their own read
   * lands), so the caller computes each while the others arrive. Held until release(L).
   */
  take(L: number, ids: number[]): Map<number, Promise<Expert>> {
    const NE = this.cfg.moe.numExperts;
    const claimed = new Map<number, Slot>();
    for (const E of ids) {
      const key = L * NE + E;
      const i = this.lru.get(key);
      if (i === undefined || claimed.has(E)) continue;
      const s = this.slots[i];
      claimed.set(E, s);
      s.holder = L;
      this.lru.delete(key);
      this.lru.set(key, i);
      this.stats.expertHits++;
      if (s.guessed) this.stats.expertPrefetchHits++;
      s.guessed = false;
    }
    const jobs = this.claimReads(L, ids.filter((E) => !claimed.has(E)), L);
    this.stats.expertMisses += jobs.length;
    for (const j of jobs) claimed.set(j.E, j.s);
    const out = new Map<number, Promise<Expert>>();
    for (const [E, s] of claimed) {
      const p = s.state === "ready" ? Promise.resolve(s.view!) : s.loading!.then(() => s.view!);
      out.set(E, this.shuffle ? this.shuffle(p) : p);
    }
    return out;
  }

  /**
   * Reads experts `ids` of layer L ahead of need (a guess: no layer holds them) into the slots
   * free now, skipping those already cached or being read; returns how many reads it issued.
   * A guess that fails to read frees its slot and is dropped; a later `take` reads it again.
   */
  prefetch(L: number, ids: number[]): number {
    const NE = this.cfg.moe.numExperts;
    const jobs = this.claimReads(L, ids.filter((E) => !this.lru.has(L * NE + E)), -1);
    for (const j of jobs) {
      j.s.guessed = true;
      j.s.loading!.catch(() => {});
    }
    this.stats.expertPrefetched += jobs.length;
    return jobs.length;
  }

  /**
   * Gives each of `ids` (misses, distinct) a free slot while there is one, marked loading for
   * `holder`, and issues all their reads in file order.
   */
  private claimReads(L: number, ids: number[], holder: number): { E: number; s: Slot }[] {
    const NE = this.cfg.moe.numExperts;
    const jobs: { E: number; s: Slot; loc: ExpertLocation }[] = [];
    for (const E of new Set(ids)) {
      const i = this.victim();
      if (i < 0) break;
      const s = this.slots[i];
      s.key = L * NE + E;
      s.state = "loading";
      s.holder = holder;
      s.guessed = false;
      s.view = undefined;
      this.lru.set(s.key, i);
      jobs.push({ E, s, loc: this.loc(L, E) });
    }
    const inFileOrder = [...jobs].sort((a, b) =>
      a.loc.file < b.loc.file ? -1 : a.loc.file > b.loc.file ? 1 : a.loc.offset - b.loc.offset
    );
    for (const j of inFileOrder) j.s.loading = this.read(L, j.E, j.s, j.loc);
    return jobs;
  }

  /** Reads one expert into its slot and publishes it; on failure frees the slot. */
  private async read(L: number, E: number, s: Slot, loc: ExpertLocation): Promise<void> {
    try {
      if (this.fault && this.fault[0] === L && this.fault[1] === E) {
        throw new K3Error(
          `short read: 0 of ${loc.bytes} bytes (fault injected by K3_FAULT_EXPERT_READ)`,
        );
      }
      const r = await readExpertSlot(loc, s.buf, (p, d) => this.file(p, d));
      this.stats.expertBytes += r.bytesRead;
      s.view = expertView(this.cfg, { ...loc, slotOffsets: loc.slotOffsets.map((o) => o + r.delta) }, s.buf);
      if (this.table) s.view.check = expertCheck(loc, tableDigest(this.table.table, L, E), this.table.path);
      s.state = "ready";
    } catch (e) {
      this.lru.delete(s.key);
      s.state = "empty";
      s.key = -1;
      s.holder = -1;
      s.view = undefined;
      throw new K3Error(`layer ${L} expert ${E}: read failed: ${(e as Error).message}`);
    }
  }

  /** The pass is done with layer L's experts (or just `ids` of them): they may be evicted now. */
  release(L: number, ids?: number[]): void {
    if (ids) {
      const NE = this.cfg.moe.numExperts;
      for (const E of ids) {
        const i = this.lru.get(L * NE + E);
        if (i !== undefined && this.slots[i].holder === L) this.slots[i].holder = -1;
      }
      return;
    }
    for (const s of this.slots) if (s.holder === L) s.holder = -1;
  }

  /** Waits for reads in flight, then frees the slots and closes the files. */
  async close(): Promise<void> {
    await Promise.allSettled(this.slots.map((s) => s.loading ?? Promise.resolve()));
    for (const s of this.slots) s.buf.free();
    this.slots.length = 0;
    for (const f of [...this.direct.values(), ...this.buffered.values()]) f.close();
  }
}

/** Delays each promise's value by 0-4 ms drawn from a xorshift generator seeded with `seed`. */
function landInShuffledOrder(seed: number): <T>(p: Promise<T>) => Promise<T> {
  let x = seed >>> 0 || 1;
  return <T>(p: Promise<T>) => {
    x ^= x << 13, x >>>= 0, x ^= x >>> 17, x ^= x << 5, x >>>= 0;
    const ms = x % 5;
    return p.then((v) => new Promise<T>((resolve) => setTimeout(() => resolve(v), ms)));
  };
}
