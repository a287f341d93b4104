/**
 * A table of the automaton's states for the whole mask: states that step alike share one
 * number, and each number remembers where every byte took it.
 *
 * Two stacks are the same state when their top frames have the same signature
 * ({@link Frame.signature}) over the same state below; a state is its set of threads. The
 * whole mask walks the vocabulary in byte order (mask.ts), one step per byte not shared with
 * the previous token; with the table most of those steps are a lookup in a row of 256, so
 * the cost of a mask is that of its distinct states, not of its 163,840 tokens. A string's
 * body, free text, whitespace and numbers have a handful of distinct states each; a free
 * object key makes one per prefix only while some declared or earlier key starts with it
 * (Obj.signature). The table stops growing at {@link StateTable.maxStates} (the walk then
 * steps the states themselves, as without a table) and is cleared before the next mask.
 *
 * The numbers name states for the table's lifetime, so they also key the mask cache of a
 * constraint (mask.ts).
 *
 * @module
 */

import { type Stack, type State, stepState } from "./automaton.ts";

/** The number of the state no thread survives (every token refused). */
export const DEAD = 0;

/** Numbered states and their byte transitions. */
export class StateTable {
  #stackIds = new WeakMap<Stack, number>();
  #stackByKey = new Map<string, number>();
  #stateByKey = new Map<string, number>();
  /** A state of each number (the first one met; all with that number step alike). */
  #states: State[] = [[]];
  /** Per number: byte -> next number + 1 (0: not stepped yet); read directly by the mask's walk. */
  rows: (Int32Array | undefined)[] = [undefined];

  /** Holds at most `maxStates` numbers (a row of 256 transitions, 1 kB, each: 4 MB at the default). */
  constructor(readonly maxStates = 1 << 12) {}

  /** Numbers given so far. */
  get size(): number {
    return this.#states.length;
  }

  /** Forgets every number (when full, between masks: numbers given before mean nothing after). */
  clear(): void {
    this.#stackIds = new WeakMap();
    this.#stackByKey = new Map();
    this.#stateByKey = new Map();
    this.#states = [[]];
    this.rows = [undefined];
  }

  #stackId(s: Stack): number {
    let id = this.#stackIds.get(s);
    if (id !== undefined) return id;
    const key = `${s.top.signature()}|${s.below === null ? 0 : this.#stackId(s.below)}`;
    id = this.#stackByKey.get(key);
    if (id === undefined) this.#stackByKey.set(key, id = this.#stackByKey.size + 1);
    this.#stackIds.set(s, id);
    return id;
  }

  /** The number of `state`, or -1 when the table is full and `state` is new. */
  id(state: State): number {
    if (state.length === 0) return DEAD;
    let key: string;
    if (state.length === 1) key = String(this.#stackId(state[0]));
    else {
      const ids = [...new Set(state.map((s) => this.#stackId(s)))].sort((a, b) => a - b);
      key = ids.join(",");
    }
    let id = this.#stateByKey.get(key);
    if (id === undefined) {
      if (this.#states.length >= this.maxStates) return -1;
      id = this.#states.length;
      this.#states.push(state);
      this.rows.push(undefined);
      this.#stateByKey.set(key, id);
    }
    return id;
  }

  /** A state numbered `id`. */
  state(id: number): State {
    return this.#states[id];
  }

  /** The number after `byte` from number `id`: a lookup once stepped, else one step of the automaton. -1: the table is full. */
  step(id: number, byte: number): number {
    let row = this.rows[id];
    if (row === undefined) this.rows[id] = row = new Int32Array(256);
    const known = row[byte];
    if (known !== 0) return known - 1;
    const next = this.id(stepState(this.#states[id], byte));
    if (next >= 0) row[byte] = next + 1;
    return next;
  }
}
