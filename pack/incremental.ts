/**
 * The trunk packed shard by shard as `k3 pull --pack` lands the shards. The layout is
 * planned from the shards' headers, fetched before the shards themselves (a safetensors
 * header is the file's first 8 + N bytes), so every region's place in the trunk is known
 * up front. Once every shard a region's tensors come from has been downloaded and its hash
 * verified, the region is packed from them at once, read through the page cache, which
 * still holds a shard just written: no shard is read back from the disk for the pack the
 * way `k3 pack` after the download reads it (O_DIRECT). A shard counts only once its hash
 * matched, so a wrong one is never packed.
 *
 * Atomic and resumable: the data goes to `trunk.bin.partial`; after each batch of regions
 * it is synced and `trunk.bin.partial.json` records the packed regions (their hashes and
 * stored sizes) and what they were packed from (the config's fingerprint; each shard's
 * name, size and SHA-256; the piece size; the codec). A later run from the same sources
 * keeps those regions and packs only the rest; from anything else it starts over. The manifest is
 * written last (pack.ts commitTrunk), so an interrupted pull never leaves a trunk that
 * looks whole, and the result is the trunk `k3 pack` makes of the same checkpoint.
 *
 * Raw pieces take their decoded size, so each region's offset is known before it is packed
 * and regions pack in whatever order their shards land; split-coded layers move the
 * regions after them by what they store, so with the split codec regions pack in file
 * order.
 *
 * @module
 */

import { configFingerprint, type K3Config, loadConfig } from "../engine/model/config.ts";
import { EXIT, K3Error } from "../engine/errors.ts";
import { writeAllSync, writeFailure, writeFileDurable } from "../engine/native/files.ts";
import { kernels } from "../engine/native/ffi.ts";
import { checkAccounted } from "../engine/weights/bind.ts";
import { DATA_FILE, MANIFEST_FILE, readManifest, type TrunkCodec, weightSample } from "../engine/weights/manifest.ts";
import { Checkpoint, parseShardHeader, readFull } from "../engine/weights/safetensors.ts";
import { type PackRegion, PIECE_BYTES, planLayout, type Region } from "../engine/weights/trunk_geometry.ts";
import {
  chooseCodec,
  commitTrunk,
  packedLine,
  type PackResult,
  packTrunk,
  PARTIAL_RECORD,
  prepareTrunkDir,
  RegionPacker,
  regionsInOrder,
  trunkManifest,
} from "./pack.ts";

/** A shard to come: its name in the model directory, its size and hash, and its header. */
export interface ComingShard {
  /** File name (`model-00001-of-00096.safetensors`). */
  name: string;
  /** Its size in bytes, as the hub lists it. */
  bytes: number;
  /** Its SHA-256 as the hub lists it (part of what a partial trunk was packed from). */
  sha256?: string;
  /** Its first 8 + N bytes: the header length and the JSON header. */
  head: Uint8Array;
}

/** Options of IncrementalPack.start. */
export interface IncrementalOptions {
  /** How the layers' pieces are stored ("auto": measured on the first shard to land). */
  codec: TrunkCodec | "auto";
  /** One-line messages (kept regions, the codec chosen, the closing line). */
  log: (line: string) => void;
  /** `n` more trunk bytes are in place (packed now, or kept from an earlier run). */
  onPacked: (n: number) => void;
  /** Staging buffer bytes (default 64 MB). */
  stageBytes?: number;
  /** Bytes per hashed piece (default PIECE_BYTES). */
  pieceBytes?: number;
}

/** What `trunk.bin.partial.json` holds. */
interface PartialRecord {
  /** What the regions were packed from (sourceIdentity). */
  source: string;
  /** The codec the layers are stored with. */
  codec: TrunkCodec;
  /** Each region in file order: packed (with its hashes), or null. */
  regions: (Region | null)[];
}

/** Reads a partial record, or undefined when there is none or it is not one. */
function readRecord(path: string): PartialRecord | undefined {
  try {
    const r = JSON.parse(Deno.readTextFileSync(path));
    return typeof r?.source === "string" && Array.isArray(r?.regions) ? r : undefined;
  } catch {
    return undefined;
  }
}

/** The trunk of a checkpoint being downloaded, packed as its shards land (see the module doc). */
export class IncrementalPack {
  /** Bytes of the trunk with every piece raw (what progress counts to). */
  readonly total: number;
  readonly #regions: PackRegion[];
  readonly #layers: Set<PackRegion>;
  /** The raw offset of each region (its place whatever order regions pack in). */
  readonly #rawOffsets: number[];
  /** The shard files each region reads. */
  readonly #needs: Set<string>[];
  readonly #packed: boolean[];
  readonly #landed = new Set<string>();
  #codec: TrunkCodec | undefined;
  #packer: RegionPacker | undefined;
  #out: Deno.FsFile | undefined;
  #queue: Promise<void> = Promise.resolve();
  /** Seconds spent packing in this run (the download's time is not the pack's). */
  #packSeconds = 0;

  private constructor(
    readonly modelDir: string,
    readonly trunkDir: string,
    private readonly cfg: K3Config,
    private readonly fingerprint: string,
    private readonly ckpt: Checkpoint,
    private readonly layout: ReturnType<typeof planLayout>,
    private readonly shards: ComingShard[],
    private readonly source: string,
    /** A complete trunk of these sources was already there: checked (k3 pack's way) at the end. */
    private readonly existing: boolean,
    private readonly opts: IncrementalOptions,
  ) {
    this.total = layout.bytes;
    this.#regions = regionsInOrder(layout);
    this.#layers = new Set(layout.layers);
    this.#rawOffsets = this.#regions.map((r) => r.region.offset);
    this.#needs = this.#regions.map((r) => new Set(r.tensors.map((t) => t.src.file)));
    this.#packed = this.#regions.map(() => false);
  }

  get #partial(): string {
    return `${this.trunkDir}/${DATA_FILE}.partial`;
  }

  get #record(): string {
    return `${this.trunkDir}/${PARTIAL_RECORD}`;
  }

  /**
   * Lays out the trunk of `modelDir` (its config.json already there) from the headers of
   * the shards to come, and prepares `trunkDir`: a partial trunk of the same sources is
   * kept, anything partial from other sources removed; a complete trunk of other sources
   * is refused (one line, before any shard is fetched).
   */
  static async start(
    modelDir: string,
    trunkDir: string,
    shards: ComingShard[],
    opts: IncrementalOptions,
  ): Promise<IncrementalPack> {
    const cfg = await loadConfig(modelDir);
    const fingerprint = await configFingerprint(cfg);
    const sorted = [...shards].sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    const files = sorted.map((s) => `${modelDir}/${s.name}`);
    const ckpt = Checkpoint.fromHeaders(
      modelDir,
      files,
      sorted.map((s, i) => parseShardHeader(files[i], s.head, s.bytes)),
    );
    checkAccounted(cfg, ckpt);
    const layout = planLayout(cfg, ckpt);
    const piece = opts.pieceBytes ?? PIECE_BYTES;
    const source = JSON.stringify({
      fingerprint,
      piece,
      shards: sorted.map((s) => ({ name: s.name, bytes: s.bytes, sha256: s.sha256 ?? null })),
    });

    await prepareTrunkDir(trunkDir);
    const listed = JSON.stringify(sorted.map((s) => ({ name: s.name, bytes: s.bytes })));
    let existing = false;
    if (await present(`${trunkDir}/${MANIFEST_FILE}`) || await present(`${trunkDir}/${DATA_FILE}`)) {
      const old = await readManifest(trunkDir).catch(() => undefined);
      existing = old !== undefined && old.fingerprint === fingerprint && JSON.stringify(old.source.shards) === listed;
      if (!existing) {
        throw new K3Error(
          `pull: --pack ${trunkDir} already holds ${
            old ? "a trunk of a different model or source" : "trunk files that are not a complete trunk"
          }; remove it or choose another directory (k3 pack --force replaces it)`,
          EXIT.usage,
        );
      }
    }
    const pack = new IncrementalPack(
      modelDir,
      trunkDir,
      cfg,
      fingerprint,
      ckpt,
      layout,
      sorted,
      source,
      existing,
      opts,
    );
    if (existing) opts.onPacked(layout.bytes);
    else pack.#resume();
    return pack;
  }

  /** Keeps what an earlier run packed from the same sources; clears anything else. */
  #resume(): void {
    const record = readRecord(this.#record);
    let kept = 0, keptBytes = 0;
    const sameCodec = this.opts.codec === "auto" || record?.codec === this.opts.codec;
    if (
      record?.source === this.source && sameCodec && record.regions.length === this.#regions.length &&
      isFile(this.#partial)
    ) {
      this.#codec = record.codec;
      record.regions.forEach((r, i) => {
        if (r === null) return;
        this.#regions[i].region = r;
        this.#packed[i] = true;
        kept++;
        keptBytes += r.size;
      });
    } else {
      for (const f of [this.#partial, this.#record]) {
        try {
          Deno.removeSync(f);
        } catch { /* not there */ }
      }
    }
    if (kept > 0) {
      this.opts.log(
        `pack: ${kept} of ${this.#regions.length} trunk regions already packed by an earlier run; kept`,
      );
      this.opts.onPacked(keptBytes);
    }
  }

  /**
   * Shard `name` is in place and verified: checks its header is the one the layout was
   * planned from, then packs every region that now has all its shards.
   */
  landed(name: string): Promise<void> {
    const run = async () => {
      if (this.existing) return;
      const shard = this.shards.find((s) => s.name === name);
      if (!shard) return; // not a shard of the trunk (a file in a subdirectory)
      const file = `${this.modelDir}/${name}`;
      const head = new Uint8Array(shard.head.length);
      const f = await Deno.open(file, { read: true });
      try {
        await readFull(f, head, 0, file);
      } finally {
        f.close();
      }
      if (head.some((b, i) => b !== shard.head[i])) {
        throw new K3Error(
          `pull: ${name}: its header is not the one the hub served before the download; run k3 pull again`,
        );
      }
      this.#landed.add(file);
      await this.#packReady(file);
    };
    // One pack at a time (transfers land concurrently); a failure stops the ones after it.
    this.#queue = this.#queue.then(run);
    return this.#queue;
  }

  /** Packs every region whose shards have all landed (in file order with the split codec). */
  async #packReady(sample: string): Promise<void> {
    this.#codec ??= this.opts.codec === "auto" ? await chooseCodec(kernels(), sample, this.opts.log) : this.opts.codec;
    const codec = this.#codec;
    if (!this.#packer) {
      this.#out = Deno.openSync(this.#partial, { write: true, create: true });
      const out = this.#out;
      this.#packer = new RegionPacker(kernels(), {
        stage: this.opts.stageBytes ?? 64 * 1024 * 1024,
        piece: this.opts.pieceBytes ?? PIECE_BYTES,
        codec,
        directReads: false,
        out: {
          // Buffered writes into a file that is kept between runs (O_DIRECT output files
          // are created empty); the data is synced before the record names it.
          write: (buf, len, offset) => {
            try {
              out.seekSync(offset, Deno.SeekMode.Start);
              writeAllSync(out, buf.u8.subarray(0, len));
              return Promise.resolve();
            } catch (e) {
              return Promise.reject(
                new K3Error(
                  `pull: ${
                    writeFailure(this.#partial, this.total, e).message
                  }; what is packed so far is kept: run k3 pull again to resume`,
                  EXIT.runtime,
                ),
              );
            }
          },
        },
        onWritten: (n) => this.opts.onPacked(n),
      });
    }
    let packed = 0;
    const t0 = performance.now();
    for (let i = 0; i < this.#regions.length; i++) {
      if (this.#packed[i]) continue;
      const ready = [...this.#needs[i]].every((f) => this.#landed.has(f));
      if (!ready) {
        if (codec === "split") break;
        continue;
      }
      const r = this.#regions[i];
      const offset = codec === "split"
        ? this.#regions.slice(0, i).reduce((a, p) => a + p.region.stored.reduce((x, y) => x + y, 0), 0)
        : this.#rawOffsets[i];
      const stored = await this.#packer.pack(r, offset, this.#layers.has(r));
      // Progress counts decoded bytes (the total is the raw trunk); the writes counted stored ones.
      this.opts.onPacked(r.region.size - stored);
      this.#packed[i] = true;
      packed++;
    }
    if (packed === 0) return;
    await this.#packer.drain();
    this.#out!.syncDataSync();
    this.#packSeconds += (performance.now() - t0) / 1000;
    // The record names only regions whose data is on the disk (synced above).
    const record: PartialRecord = {
      source: this.source,
      codec,
      regions: this.#regions.map((r, i) => this.#packed[i] ? r.region : null),
    };
    const tmp = `${this.#record}.tmp`;
    try {
      Deno.removeSync(tmp);
    } catch { /* not there */ }
    writeFileDurable(tmp, new TextEncoder().encode(JSON.stringify(record) + "\n"));
    Deno.renameSync(tmp, this.#record);
    const left = this.#packed.filter((p) => !p).length;
    this.opts.log(
      `pack: ${packed} trunk region${packed === 1 ? "" : "s"} packed once ${
        sample.slice(sample.lastIndexOf("/") + 1)
      } landed; ${left ? `${left} to go` : "all packed"}`,
    );
  }

  /** Every shard has landed: writes the manifest and puts the trunk in place. */
  async finish(): Promise<PackResult> {
    await this.#queue;
    if (this.existing) {
      this.close();
      // k3 pack's own check: the same trunk is left as it is (a different one refused).
      return await packTrunk(this.modelDir, this.trunkDir, { codec: "auto", log: this.opts.log });
    }
    const missing = this.#regions.findIndex((_, i) => !this.#packed[i]);
    if (missing >= 0) {
      throw new K3Error(`pull: the trunk's ${this.#regions[missing].what} was not packed: a shard it needs is missing`);
    }
    this.#out?.close();
    this.#out = undefined;
    const bytes = this.#regions.reduce((a, r) => a + r.region.stored.reduce((x, y) => x + y, 0), 0);
    const manifest = trunkManifest({
      cfg: this.cfg,
      fingerprint: this.fingerprint,
      sample: await weightSample(kernels(), this.cfg, this.ckpt),
      source: { dir: this.modelDir, shards: this.shards.map((s) => ({ name: s.name, bytes: s.bytes })) },
      layout: this.layout,
      bytes,
      piece: this.opts.pieceBytes ?? PIECE_BYTES,
      codec: this.#codec!,
    });
    await commitTrunk(this.trunkDir, manifest);
    this.close();
    const seconds = this.#packSeconds;
    this.opts.log(packedLine(this.trunkDir, manifest, this.total, seconds));
    return { manifest, seconds, bytes, upToDate: false };
  }

  /** Frees the buffers and closes the files; a partial trunk stays for the next run. */
  close(): void {
    this.#packer?.free();
    this.#packer = undefined;
    this.#out?.close();
    this.#out = undefined;
    this.ckpt.close();
  }
}

async function present(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

function isFile(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}
