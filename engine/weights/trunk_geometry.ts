/**
 * The packed trunk's geometry: where everything lies, and how big it is. The data file
 * holds one region per decoder layer, then the final vectors, the embedding and the lm_head
 * (`trunkRegionSpecs`), each starting at a 4096-aligned offset with its tensors at 64-byte
 * aligned offsets inside (`planLayout`); a region is read and hashed in pieces of `piece`
 * bytes (`pieceSpans`), each stored raw or split-coded, so a piece's place in the file is
 * the stored bytes of the pieces before it. In memory, the pieces a streamed layer leaves
 * coded take only their stored bytes (`keptCoded`, `piecePlaces`), which moves the tensors
 * after them (`placeOf`), and a matrix in coded pieces is bound through a descriptor
 * (`pieceRange`, `descriptorBytes`).
 *
 * The manifest (manifest.ts) records this geometry and is checked against it; the trunk
 * file (trunk_file.ts) and the ring (trunk_ring.ts) read and bind by it. Nothing here does
 * I/O.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { ALIGN, alignUp } from "../native/io.ts";
import type { Keep } from "../native/tensors.ts";
import {
  checkTensor,
  globalTensors,
  HEAD_NAME,
  layerTensors,
  PREFIX,
  readOutsideProducts,
  type TensorSpec,
} from "../model/tensors.ts";
import type { Checkpoint, TensorInfo } from "./safetensors.ts";

/** Where the coded pieces of a streamed layer are decoded: by the products that read them
 * ("product", the default: pieces that hold only such matrices stay coded in the ring), or
 * every piece on the I/O threads as it lands ("io", to measure the two side by side). */
export type TrunkDecode = "product" | "io";

/** Bytes per hashed piece: the unit of every trunk read and its checksum. */
export const PIECE_BYTES = 16 << 20;

/** Tensor alignment inside a region. */
export const TENSOR_ALIGN = 64;

/** One tensor of a region. */
export interface TensorEntry {
  /** Name without the `language_model.model.` prefix (the head: its full name). */
  name: string;
  /** Bound dtype. */
  dtype: "BF16" | "F32";
  /** How the tensor is bound. */
  keep: Keep;
  /** The checkpoint's shape. */
  shape: number[];
  /** Byte offset inside the region. */
  offset: number;
  /** Bytes in the region. */
  bytes: number;
  /** The matrix check of its bytes (native/tensors.ts), hex. */
  check: string;
}

/** One aligned region of the data file. */
export interface Region {
  /** Offset in the data file. */
  offset: number;
  /** Padded to ALIGN. */
  size: number;
  /** Bytes of content before padding. */
  bytes: number;
  /** Checksum (k3w64, hex). */
  hash: string;
  /** k3w64 of each `piece`-byte piece of the region's `size` bytes (the last shorter). */
  pieces: string[];
  /** The tensors in the region, in order. */
  tensors: TensorEntry[];
  /** Bytes each piece takes in the data file (its length: raw; fewer: split-coded). */
  stored: number[];
  /** k3w64 of each piece's stored bytes (hex; a raw piece's equals its `pieces` hash). */
  storedPieces: string[];
}

/** Where one piece of a region is: in the region, and in the data file. */
export interface PieceSpan {
  /** Its first byte in the region (decoded form). */
  at: number;
  /** Its decoded bytes. */
  len: number;
  /** Its offset in the data file. */
  file: number;
  /** Its stored bytes (`len`: raw). */
  stored: number;
}

const spanCache = new WeakMap<Region, PieceSpan[]>();

/** The pieces of region `r` (`piece` bytes each, the last shorter), where each is stored. */
export function pieceSpans(r: Region, piece: number): PieceSpan[] {
  let spans = spanCache.get(r);
  if (!spans) {
    spans = [];
    let file = r.offset;
    for (let i = 0, at = 0; at < r.size; i++, at += piece) {
      const len = Math.min(piece, r.size - at);
      spans.push({ at, len, file, stored: r.stored[i] });
      file += r.stored[i];
    }
    spanCache.set(r, spans);
  }
  return spans;
}

/** Bytes region `r` takes in the data file. */
export function storedSize(r: Region): number {
  return r.stored.reduce((a, b) => a + b, 0);
}

/**
 * The run of whole pieces [first, last] of region `r` as a region of its own (its file
 * offset, sizes and per-piece tables cut to the run), for reading part of a region.
 */
export function pieceRun(r: Region, piece: number, first: number, last: number): Region {
  const spans = pieceSpans(r, piece);
  const size = spans[last].at + spans[last].len - spans[first].at;
  return {
    ...r,
    offset: spans[first].file,
    size,
    bytes: size,
    pieces: r.pieces.slice(first, last + 1),
    stored: r.stored.slice(first, last + 1),
    storedPieces: r.storedPieces.slice(first, last + 1),
  };
}

/** The regions of a manifest in file order, named. */
export function regionsOf(m: { layer: Region[]; finals: Region; embed: Region; head: Region }): [string, Region][] {
  return [
    ...m.layer.map((r, i) => [`layer ${i}`, r] as [string, Region]),
    ["finals", m.finals],
    ["embed", m.embed],
    ["head", m.head],
  ];
}

/** A tensor to pack: where it comes from and where it goes. */
export interface PackTensor {
  /** The source tensor. */
  src: TensorInfo;
  /** What the engine binds. */
  spec: TensorSpec;
  /** Its manifest entry. */
  entry: TensorEntry;
}

/** A region to pack (hashes filled in while writing). */
export interface PackRegion {
  /** What the region holds (for messages). */
  what: string;
  /** The region. */
  region: Region;
  /** Its tensors. */
  tensors: PackTensor[];
}

/** Bound dtype and bytes of a checkpoint tensor kept as `keep`. */
export function boundOf(
  src: { dtype: string; bytes: number },
  keep: Keep,
): { dtype: "BF16" | "F32"; bytes: number } {
  const elems = src.bytes / (src.dtype === "F32" ? 4 : 2);
  if (keep === "matrix" && src.dtype === "BF16") return { dtype: "BF16", bytes: src.bytes };
  return { dtype: "F32", bytes: elems * 4 };
}

/** A region of `specs` from the checkpoint, its tensors back to back at TENSOR_ALIGN. */
function region(
  what: string,
  specs: TensorSpec[],
  ckpt: Checkpoint,
  prefix: (s: TensorSpec) => string,
): PackRegion {
  let at = 0;
  const tensors: PackTensor[] = specs.map((spec) => {
    const src = ckpt.get(prefix(spec) + spec.name);
    checkTensor(src, spec);
    const b = boundOf(src, spec.keep);
    at = Math.ceil(at / TENSOR_ALIGN) * TENSOR_ALIGN;
    const entry: TensorEntry = {
      name: spec.name,
      dtype: b.dtype,
      keep: spec.keep,
      shape: src.shape,
      offset: at,
      bytes: b.bytes,
      check: "", // filled in while packing
    };
    at += b.bytes;
    return { src, spec, entry };
  });
  const size = Math.max(ALIGN, alignUp(at));
  return {
    what,
    region: {
      offset: 0,
      size,
      bytes: at,
      hash: "",
      pieces: [],
      tensors: tensors.map((t) => t.entry),
      stored: [],
      storedPieces: [],
    },
    tensors,
  };
}

/** The tensors each region of a trunk of `cfg` holds, in order: each layer's dense tensors,
 * the final vectors, the embedding, the lm_head (its name is the checkpoint's full name). */
export function trunkRegionSpecs(
  cfg: K3Config,
): { layers: TensorSpec[][]; finals: TensorSpec[]; embed: TensorSpec[]; head: TensorSpec[] } {
  const D = cfg.hiddenSize, V = cfg.vocabSize;
  return {
    layers: Array.from({ length: cfg.numLayers }, (_, L) => layerTensors(cfg, L)),
    finals: globalTensors(cfg),
    embed: [{ name: "embed_tokens.weight", shape: [V, D], keep: "matrix" }],
    head: [{ name: HEAD_NAME, shape: [V, D], keep: "matrix" }],
  };
}

/** The layout of a trunk for this checkpoint: every region with its tensors and offset
 * (offsets as if every piece were raw: the packer moves them by the stored sizes). */
export function planLayout(
  cfg: K3Config,
  ckpt: Checkpoint,
): {
  layers: PackRegion[];
  finals: PackRegion;
  embed: PackRegion;
  head: PackRegion;
  bytes: number;
} {
  const specs = trunkRegionSpecs(cfg);
  const layers = specs.layers.map((s, L) => region(`layer ${L}`, s, ckpt, () => PREFIX));
  const finals = region("finals", specs.finals, ckpt, () => PREFIX);
  const embed = region("embed", specs.embed, ckpt, () => PREFIX);
  const head = region("head", specs.head, ckpt, () => "");
  let off = 0;
  for (const r of [...layers, finals, embed, head]) {
    r.region.offset = off;
    off += r.region.size;
  }
  return { layers, finals, embed, head, bytes: off };
}

/**
 * Which pieces of region `r` the ring can leave coded: the coded pieces that hold nothing
 * but bf16 matrices only the dense product reads (so no vector, and no matrix another kernel
 * reads, ever sees coded bytes).
 */
export function keptCoded(r: Region, piece: number): Uint8Array {
  const spans = pieceSpans(r, piece);
  const kept = new Uint8Array(spans.length);
  spans.forEach((s, j) => {
    kept[j] = s.stored < s.len &&
        r.tensors.every((t) =>
          t.offset + t.bytes <= s.at || t.offset >= s.at + s.len ||
          (t.keep === "matrix" && t.dtype === "BF16" && !readOutsideProducts(t.name))
        )
      ? 1
      : 0;
  });
  return kept;
}

/**
 * Where each piece of a region goes in memory when the pieces left coded take only their
 * stored bytes: back to back, a kept piece `stored` bytes, any other its decoded length.
 * The last entry is the bytes of them all. A tensor in pieces that are not kept is then
 * still contiguous (those pieces keep their own bytes, one after the other).
 */
export function piecePlaces(r: Region, piece: number, kept: Uint8Array): number[] {
  const places = [0];
  for (const [j, s] of pieceSpans(r, piece).entries()) places.push(places[j] + (kept[j] ? s.stored : s.len));
  return places;
}

/** The first and last piece a tensor's bytes fall in. */
export function pieceRange(t: TensorEntry, piece: number): [number, number] {
  return [Math.floor(t.offset / piece), Math.floor((t.offset + t.bytes - 1) / piece)];
}

/** Bytes of the descriptors (kernels/k3.h k3_split_matrix) of a region's matrices. */
export function descriptorBytes(tensors: readonly TensorEntry[], piece: number): number {
  return tensors.filter((t) => t.keep === "matrix").reduce((a, t) => {
    const [p0, p1] = pieceRange(t, piece);
    return a + 16 + 24 * (p1 - p0 + 1);
  }, 0);
}

/**
 * The byte range of a region's attention tensors (`self_attn.*`), when they form one run in
 * the region with nothing else inside; else an empty range (the layer is then freed whole).
 */
export function attentionSpan(tensors: readonly TensorEntry[]): [number, number] {
  const sorted = [...tensors].sort((a, b) => a.offset - b.offset);
  const isAttn = (t: TensorEntry) => t.name.includes(".self_attn.");
  const first = sorted.findIndex(isAttn);
  if (first < 0) return [0, 0];
  let last = first;
  while (last + 1 < sorted.length && isAttn(sorted[last + 1])) last++;
  if (sorted.slice(last + 1).some(isAttn)) return [0, 0];
  // The run ends where the next tensor starts (padding included), or at the last one's end.
  const end = last + 1 < sorted.length ? sorted[last + 1].offset : sorted[last].offset + sorted[last].bytes;
  return [sorted[first].offset, end];
}

/** The pieces of region `r` the ring leaves coded and where each goes (none when `decode`
 * is "io"): the one rule the ring and the plan both use. */
export function ringPlaces(r: Region, piece: number, decode: TrunkDecode): { kept: Uint8Array; places: number[] } {
  const kept = decode === "io" ? new Uint8Array(Math.ceil(r.size / piece)) : keptCoded(r, piece);
  return { kept, places: piecePlaces(r, piece, kept) };
}

/** What streaming region `r` takes: `footprint`, the bytes it reads and holds in the ring
 * (its pieces' places, the pieces left coded taking their stored bytes), and `coded`, the
 * decoded bytes of those pieces, which the products decode. */
export function streamedLayout(
  r: Region,
  piece: number,
  decode: TrunkDecode,
): { footprint: number; coded: number } {
  const { kept, places } = ringPlaces(r, piece, decode);
  const coded = pieceSpans(r, piece).reduce((a, s, j) => a + (kept[j] ? s.len : 0), 0);
  return { footprint: places[places.length - 1], coded };
}

/** A region offset at a piece boundary, or inside a piece that is not kept, as a ring offset. */
export function placeOf(offset: number, places: readonly number[], piece: number): number {
  const p = Math.floor(offset / piece);
  return p >= places.length - 1 ? places[places.length - 1] : places[p] + offset - p * piece;
}

/**
 * The part of a layer's attention span (region offsets) that can be freed once the pass is
 * past attention: a piece left coded holds the coded bytes of all its words in one place, so
 * a kept piece that the span's start or end cuts holds bytes the tensors beside the span
 * need until the layer is done.
 */
export function freedEarly(span: [number, number], kept: Uint8Array, piece: number): [number, number] {
  let [a, b] = span;
  if (a % piece !== 0 && kept[Math.floor(a / piece)]) a = Math.ceil(a / piece) * piece;
  if (b % piece !== 0 && kept[Math.floor(b / piece)]) b = Math.floor(b / piece) * piece;
  return a < b ? [a, b] : [0, 0];
}
