/**
 * The streaming ring: the trunk (every layer's dense tensors) when it does not all stay in
 * memory, some layers pinned (read once from the trunk file, trunk_file.ts) and the rest
 * streamed through one ring arena, read ahead of the forward pass and handed out a layer at
 * a time.
 *
 * What is streamed is read plainly and checked where it is used, against the manifest's
 * tensor checks (native/tensors.ts): each matrix by the product that multiplies it
 * (k3_matmul_checked, from the weight blocks it loads anyway), each vector when the layer is
 * handed out; by the time a layer is done, every one of its matrices has been verified, or
 * the run has stopped. Hashing each 16 MB piece after it lands was a second pass over every
 * streamed byte, 5-8% of a floor-budget token here; the check in the product costs ~13% of
 * the dense product's own time, which the disk hides at the floor (bench/verify.ts).
 *
 * The ring holds a FIFO of variable-size layer regions: streamed layers are read ahead in
 * the order the forward pass uses them (wrapping to the next token's first streamed layer)
 * while the current layer computes. Reads go piece by piece, each piece once no older layer
 * needs its ring bytes: a layer frees its attention tensors' bytes when the pass is past its
 * attention (`attentionDone`) and the rest at `done(L)`, so the next layer reads into the
 * first while the MLP computes, and the layer being computed is never overwritten. A layer
 * is handed out only after every piece came in and its vectors matched; a failed check
 * stops the run (exit 1) naming the layer and the tensor.
 *
 * A split-coded trunk (manifest version 5): a coded piece that holds only matrices the dense
 * product reads is left coded in the ring (its header and block index checked on the I/O
 * thread), taking only its stored bytes there, and its matrices are bound as
 * WTYPE.bf16Split: the product decodes them a window of rows at a time into cache as it
 * multiplies, so their bytes cross memory once, coded, the decode runs on the compute
 * threads beside the product instead of on the I/O threads against it, and the same ring
 * reads further ahead. Other coded pieces (vectors, MLA's kv_b_proj) are decoded in place as
 * they land. The trunk decode "io" (engine/open.ts OpenOptions.trunkDecode, the CLI's
 * `K3_TRUNK_DECODE=io`) decodes every piece in place (to measure the two side by side:
 * bench/limits.ts).
 *
 * @module
 */

import type { Kernels } from "../native/ffi.ts";
import { NativeBuffer } from "../native/memory.ts";
import type { IoStats } from "../model/weight_source.ts";
import type { BoundTensors } from "./bind.ts";
import { bindRegion, type TrunkFile } from "./trunk_file.ts";
import {
  attentionSpan,
  descriptorBytes,
  freedEarly,
  placeOf,
  type Region,
  ringPlaces,
  storedSize,
  type TrunkDecode,
} from "./trunk_geometry.ts";

/**
 * Ring pieces in flight at most (16 MB each). Reads are issued from the JS thread, which
 * the forward pass keeps busy for a whole layer at a time, so what is in flight when a
 * layer starts computing is all the disk gets until the pass next yields: issue deep.
 */
const RING_PIECES_IN_FLIGHT = 64;

interface RingEntry {
  L: number;
  off: number;
  /** Ring bytes it takes (its pieces' places: fewer than the region's when pieces stay coded). */
  size: number;
  region: Region;
  /** Region bytes [attn[0], attn[1]): the attention tensors, free once the pass is past them. */
  attn: [number, number];
  /** The pass is done with this layer's attention. */
  attnDone: boolean;
  /** Per piece: its read was started. */
  started: Uint8Array;
  /** Per piece: left coded for the product (trunk_geometry.ts keptCoded). */
  kept: Uint8Array;
  /** Pieces read and verified. */
  done: number;
  /** Pieces in flight. */
  inflight: number;
  /** CPU seconds the I/O threads spent decoding its coded pieces. */
  decodeSeconds: number;
  /** The ring is dropping this entry: start nothing more. */
  cancelled: boolean;
  /** Settles when every piece is in (or the read failed or was dropped); never rejects. */
  settled: Promise<void>;
  settle: () => void;
  bound?: BoundTensors;
  error?: Error;
}

/** Where a streamed layer's pieces go in its ring space (trunk_geometry.ts piecePlaces). */
interface LayerPlaces {
  /** Per piece: left coded for the product. */
  kept: Uint8Array;
  /** Where each piece starts in the layer's ring space; the last entry is its size. */
  places: number[];
  /** Its matrices' descriptors, when any piece is left coded. */
  descriptors?: NativeBuffer;
}

/** Pinned layers plus a read-ahead ring over the rest. */
export class StreamedTrunk {
  private readonly pinnedLayers = new Map<number, { buf: NativeBuffer; bound: BoundTensors }>();
  private readonly streamed: number[];
  private readonly queue: RingEntry[] = [];
  private next = 0;
  private readonly ring?: NativeBuffer;
  /** Ring pieces in flight. */
  private inflight = 0;
  /** Per streamed layer: the pieces left coded, their places, and its matrices' descriptors. */
  private readonly coded = new Map<number, LayerPlaces>();

  private constructor(
    private readonly k: Kernels,
    private readonly trunk: TrunkFile,
    numLayers: number,
    pinned: number[],
    ringBytes: number,
    private readonly stats: IoStats,
    private readonly decode: TrunkDecode,
  ) {
    this.streamed = Array.from({ length: numLayers }, (_, L) => L).filter((L) => !pinned.includes(L));
    if (this.streamed.length > 0) this.ring = NativeBuffer.alloc(k, ringBytes, "trunk ring");
  }

  /** Reads and verifies the pinned layers, allocates the ring and starts reading ahead;
   * `decode` says where the coded pieces of streamed layers are decoded. */
  static async open(
    k: Kernels,
    trunk: TrunkFile,
    numLayers: number,
    pinned: number[],
    ringBytes: number,
    stats: IoStats,
    decode: TrunkDecode,
  ): Promise<StreamedTrunk> {
    const t = new StreamedTrunk(k, trunk, numLayers, pinned, ringBytes, stats, decode);
    try {
      for (const L of pinned) {
        const r = trunk.manifest.layer[L];
        const d0 = trunk.decodeSeconds;
        const buf = await trunk.readVerified(`layer ${L}`, r);
        stats.trunkDecodeSeconds += trunk.decodeSeconds - d0;
        t.pinnedLayers.set(L, { buf, bound: bindRegion(r.tensors, buf) });
        stats.pinnedLayers++;
      }
      t.fill();
    } catch (e) {
      await t.close();
      throw e;
    }
    return t;
  }

  /**
   * Where a region of `size` bytes goes in the ring, or -1 for not yet. Regions follow each
   * other around the ring; a new one may overlap the oldest region (the layer in use or next
   * in use), whose bytes its pieces then wait for, but no other.
   */
  private place(size: number): number {
    const cap = this.ring!.bytes;
    if (size > cap) return -1;
    if (this.queue.length === 0) return 0;
    const last = this.queue[this.queue.length - 1];
    const tail = last.off + last.size;
    const off = tail + size <= cap ? tail : 0;
    const overlapsYounger = this.queue.slice(1).some((e) => off < e.off + e.size && off + size > e.off);
    return overlapsYounger ? -1 : off;
  }

  /** Queues reads of the next streamed layers while they have a place, and starts what can start. */
  private fill(): void {
    if (!this.ring) return;
    while (true) {
      const L = this.streamed[this.next];
      if (this.queue.some((e) => e.L === L)) break; // every streamed layer is already in the ring
      const region = this.trunk.manifest.layer[L], piece = this.trunk.manifest.piece;
      const { kept, places } = this.codedOf(L);
      const size = places[places.length - 1];
      const off = this.place(size);
      if (off < 0) break;
      const [a0, a1] = freedEarly(attentionSpan(region.tensors), kept, piece);
      const { promise, resolve } = Promise.withResolvers<void>();
      this.queue.push({
        L,
        off,
        size,
        region,
        attn: [placeOf(a0, places, piece), placeOf(a1, places, piece)],
        attnDone: false,
        started: new Uint8Array(Math.ceil(region.size / piece)),
        kept,
        done: 0,
        inflight: 0,
        decodeSeconds: 0,
        cancelled: false,
        settled: promise,
        settle: resolve,
      });
      this.next = (this.next + 1) % this.streamed.length;
    }
    this.pump();
  }

  /** Layer L's pieces left coded (none when every piece is decoded as it lands) and places. */
  private codedOf(L: number): LayerPlaces {
    let c = this.coded.get(L);
    if (!c) {
      const region = this.trunk.manifest.layer[L], piece = this.trunk.manifest.piece;
      const { kept, places } = ringPlaces(region, piece, this.decode);
      // One descriptor buffer per layer, rewritten at each bind: a layer is in the ring once.
      const descriptors = kept.some((x) => x === 1)
        ? NativeBuffer.alloc(this.k, descriptorBytes(region.tensors, piece), `layer ${L} coded matrices`)
        : undefined;
      this.coded.set(L, c = { kept, places, descriptors });
    }
    return c;
  }

  /** True when entry `e` still needs any ring byte of [from, to). */
  private holds(e: RingEntry, from: number, to: number): boolean {
    const a = e.off, b = e.off + e.size;
    if (to <= a || from >= b) return false;
    if (!e.attnDone) return true;
    const x = a + e.attn[0], y = a + e.attn[1];
    return (from < x && to > a) || (from < b && to > y);
  }

  /**
   * Starts every piece whose ring bytes no older entry needs, oldest entries first, up to
   * RING_PIECES_IN_FLIGHT. Synchronous: called where space is released (attentionDone, done)
   * so the reads go out at once even while the pass keeps the JS thread.
   */
  private pump(): void {
    for (let qi = 0; qi < this.queue.length; qi++) {
      const e = this.queue[qi];
      if (e.cancelled || e.error) continue;
      const { places } = this.codedOf(e.L);
      for (let j = 0; j < e.started.length; j++) {
        if (this.inflight >= RING_PIECES_IN_FLIGHT) return;
        if (e.started[j]) continue;
        const from = e.off + places[j], to = e.off + places[j + 1];
        const older = this.queue.slice(0, qi);
        if (older.some((o) => this.holds(o, from, to))) continue;
        // Space an older layer still occupies but released after its attention: read early.
        if (older.some((o) => from < o.off + o.size && to > o.off)) this.stats.trunkEarlyBytes += to - from;
        e.started[j] = 1;
        this.readPiece(e, j);
      }
    }
  }

  /** Reads piece j of entry e into its ring bytes, decoding it there on the I/O thread when it
   * is coded; its bytes are verified by their tensor checks once bound. */
  private readPiece(e: RingEntry, j: number): void {
    this.inflight++;
    e.inflight++;
    const place = this.ring!.at(e.off + this.codedOf(e.L).places[j]);
    this.trunk.readPiece(`layer ${e.L} (streamed)`, e.region, j, place, e.kept[j] === 1)
      .then((decodeSeconds) => {
        e.done++;
        e.decodeSeconds += decodeSeconds;
      })
      .catch((err) => {
        e.error ??= err;
      })
      .finally(() => {
        this.inflight--;
        e.inflight--;
        if (e.inflight === 0 && (e.error || e.cancelled || e.done === e.started.length)) this.finish(e);
        this.pump();
      });
  }

  /** Settles entry e: bound when every piece came in, its vectors checked and its matrices
   * carrying their checks (verify false, only for bench/verify.ts: nothing checked). */
  private finish(e: RingEntry): void {
    if (!e.error && !e.cancelled) {
      const checked = this.trunk.verify ? { k: this.k, what: `${this.trunk.dir}: layer ${e.L} (streamed)` } : undefined;
      try {
        const { kept, places, descriptors } = this.codedOf(e.L);
        const coded = descriptors && {
          kept,
          places,
          descriptors,
          piece: this.trunk.manifest.piece,
          size: e.region.size,
          stored: e.region.stored,
        };
        e.bound = bindRegion(e.region.tensors, this.ring!, e.off, checked, coded);
      } catch (err) {
        e.error = err as Error;
      }
    }
    e.settle();
  }

  /** The bound tensors of layer L (waits for its read). */
  layer(L: number): BoundTensors | Promise<BoundTensors> {
    const p = this.pinnedLayers.get(L);
    if (p) return p.bound;
    return this.streamedLayer(L);
  }

  /** Drops every queued entry: pieces not started never start; those in flight finish. */
  private async drain(): Promise<void> {
    for (const e of this.queue) {
      e.cancelled = true;
      if (e.inflight === 0) this.finish(e);
    }
    await Promise.all(this.queue.map((x) => x.settled));
    this.queue.length = 0;
  }

  /** Layer `L` from the ring (read ahead, then bound). */
  private async streamedLayer(L: number): Promise<BoundTensors> {
    let e = this.queue[0];
    if (!e || e.L !== L) {
      // Not the layer the ring expected (a different pass order): drain and restart there.
      await this.drain();
      this.next = this.streamed.indexOf(L);
      if (this.next < 0) throw new Error(`internal: layer ${L} is neither pinned nor streamed`);
      this.fill();
      e = this.queue[0];
    }
    const t0 = performance.now();
    await e.settled;
    this.stats.ioWaitSeconds += (performance.now() - t0) / 1000;
    if (e.error) throw e.error;
    // Counted when used, so a read-ahead the run never uses is not charged to a token.
    this.stats.trunkBytes += e.region.size;
    this.stats.trunkStoredBytes += storedSize(e.region);
    this.stats.trunkDecodeSeconds += e.decodeSeconds;
    e.kept.forEach((x, j) => this.stats.trunkCodedBytes += x * e.region.stored[j]);
    return e.bound!;
  }

  /** The pass is done with layer L's attention tensors: the next layers may read into them now. */
  attentionDone(L: number): void {
    const e = this.queue.find((x) => x.L === L);
    if (!e || e.attnDone) return;
    e.attnDone = true;
    this.pump();
  }

  /** The pass is done with layer L: its ring space can be reused. Every matrix of a streamed
   * layer must have been verified by then (a product, or verifyMatrix for other kernels). */
  done(L: number): void {
    if (this.pinnedLayers.has(L)) return;
    const i = this.queue.findIndex((x) => x.L === L);
    if (i < 0) return;
    const [e] = this.queue.splice(i, 1);
    for (const [name, m] of e.bound?.matrices ?? []) {
      if (m.check && !m.check.verified) throw new Error(`internal: layer ${L}: ${name} was never verified`);
    }
    this.fill();
  }

  /** Waits for reads in flight (dropping those not started), then frees everything. */
  async close(): Promise<void> {
    await this.drain();
    for (const p of this.pinnedLayers.values()) p.buf.free();
    this.pinnedLayers.clear();
    for (const c of this.coded.values()) c.descriptors?.free();
    this.coded.clear();
    this.ring?.free();
  }
}
