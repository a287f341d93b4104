/**
 * Kimi K3's pre-tokenizer: the regex that cuts text into pieces before BPE.
 *
 * The released `pat_str` is written for Rust's regex / fancy-regex syntax and uses
 * character-class intersection (`[A&&[^\p{Han}]]`). {@link K3_PAT_STR} keeps it verbatim
 * (the parity tests feed it to the official tiktoken core); {@link K3_PATTERN} is the
 * JavaScript translation, which is proven equal to it by `tests/tokenizer_test.ts`.
 *
 * Translation notes (each one is a place where a naive port silently differs):
 * - `A&&[^\p{Han}]` becomes the `v`-flag subtraction `[A--\p{Script=Han}]`. In Rust,
 *   `\p{Han}` is the Script property (not Script_Extensions), so is `\p{Script=Han}`.
 * - Rust's `\s` is Unicode `White_Space`; JavaScript's `\s` also matches U+FEFF and
 *   misses U+0085 (NEL). So `\s` is spelled `\p{White_Space}` and `\S` `\P{White_Space}`.
 * - `(?i:'s|'t|...)` is spelled with explicit case sets, so it does not depend on regexp
 *   modifier support. Unicode simple case folding adds exactly one extra letter here:
 *   U+017F LATIN SMALL LETTER LONG S folds to `s`, and Rust's `(?i)` matches it.
 *
 * @module
 */

/** The pre-tokenizer pattern of the released K3 tokenizer, in Rust regex syntax. */
export const K3_PAT_STR: string = [
  String.raw`[\p{Han}]+`,
  String
    .raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String
    .raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

const WS = String.raw`\p{White_Space}`;
/** Upper/title/modifier/other letters and marks, minus Han. */
const UPPER = String.raw`[[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]--\p{Script=Han}]`;
/** Lower/modifier/other letters and marks, minus Han. */
const LOWER = String.raw`[[\p{Ll}\p{Lm}\p{Lo}\p{M}]--\p{Script=Han}]`;
const CONTRACTION = String.raw`(?:'(?:[sS\u017F]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))`;

/** Source of the JavaScript (`v` flag) translation of {@link K3_PAT_STR}. */
export const K3_PATTERN_SOURCE: string = [
  String.raw`\p{Script=Han}+`,
  String.raw`[^\r\n\p{L}\p{N}]?${UPPER}*${LOWER}+${CONTRACTION}?`,
  String.raw`[^\r\n\p{L}\p{N}]?${UPPER}+${LOWER}*${CONTRACTION}?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^${WS}\p{L}\p{N}]+[\r\n]*`,
  String.raw`${WS}*[\r\n]+`,
  String.raw`${WS}+(?!\P{White_Space})`,
  String.raw`${WS}+`,
].join("|");

/**
 * A fresh global regex for K3's pre-tokenizer. Callers that drive it with `lastIndex`
 * should own their instance, hence a factory rather than a shared object.
 */
export function k3Pattern(): RegExp {
  return new RegExp(K3_PATTERN_SOURCE, "gv");
}

/** The K3 pre-tokenizer applied to `text`: the list of pieces, in order. */
export function pretokenize(text: string): string[] {
  const re = k3Pattern();
  const pieces: string[] = [];
  for (let m = re.exec(text); m !== null; m = re.exec(text)) pieces.push(m[0]);
  return pieces;
}
