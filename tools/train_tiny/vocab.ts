/**
 * The tiny English model's vocabulary and token streams, made with the engine's own code
 * (so the ids the model is trained on are exactly what `k3` encodes):
 *
 *   deno run -A tools/train_tiny/vocab.ts DATA_DIR OUT_DIR
 *
 * Trains byte-level BPE (tests/fixtures/train_tiny_vocab.ts: K3's pre-tokenizer, 256
 * bytes + 512 merges = 768 ranks, the 256 added ids 768..1023 of the chat template at
 * K3's offsets) on DATA_DIR/train.txt, writes OUT_DIR/tiktoken.model and
 * OUT_DIR/tokenizer_config.json, then encodes DATA_DIR/train.txt and heldout.txt with
 * that tokenizer into DATA_DIR/train.ids and heldout.ids (uint16 little-endian).
 *
 * @module
 */

import { trainTinyVocab } from "../../tests/fixtures/train_tiny_vocab.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";

/** Encodes `text` and writes the ids as uint16 little-endian to `path`; returns the count. */
function writeIds(tok: Tokenizer, text: string, path: string): number {
  const ids = tok.encode(text, { allowSpecial: false });
  const out = new Uint8Array(ids.length * 2);
  const view = new DataView(out.buffer);
  ids.forEach((id, i) => view.setUint16(2 * i, id, true));
  Deno.writeFileSync(path, out);
  return ids.length;
}

if (import.meta.main) {
  const [data, out] = Deno.args;
  if (!data || !out) {
    console.error("usage: vocab.ts DATA_DIR OUT_DIR");
    Deno.exit(2);
  }
  const train = Deno.readTextFileSync(`${data}/train.txt`);
  const { model, config } = trainTinyVocab(train);
  Deno.mkdirSync(out, { recursive: true });
  Deno.writeTextFileSync(`${out}/tiktoken.model`, model);
  Deno.writeTextFileSync(`${out}/tokenizer_config.json`, config);
  const tok = Tokenizer.load(out);
  for (const split of ["train", "heldout"]) {
    const text = split === "train" ? train : Deno.readTextFileSync(`${data}/heldout.txt`);
    const n = writeIds(tok, text, `${data}/${split}.ids`);
    console.error(`${split}: ${text.length} chars -> ${n} tokens (${(text.length / n).toFixed(2)} chars/token)`);
  }
}
