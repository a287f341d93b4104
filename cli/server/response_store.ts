/**
 * Stored responses (`store`, on by default as in OpenAI's API): each finished response's
 * conversation and output items, kept in memory so a later request can continue it
 * (`previous_response_id`) or name its items (`item_reference`). Entries belong to the
 * API key that made them (a request sees only its own key's), and the store holds at most
 * {@link MAX_STORED} responses: the least recently used is evicted first. Nothing is
 * written to disk; a restart forgets everything.
 *
 * @module
 */

import type { Json, StoredLookup } from "./responses.ts";

/** Stored responses at most, over every key. */
export const MAX_STORED = 512;

interface Entry {
  key: string;
  conversation: Json[];
  items: Json[];
}

/** The responses of every key, least recently used first. */
export class ResponseStore {
  /** By `key \0 response id`, in use order. */
  readonly #entries = new Map<string, Entry>();
  /** `key \0 item id` -> `key \0 response id`. */
  readonly #items = new Map<string, string>();

  /** Holds at most `max` responses. */
  constructor(readonly max = MAX_STORED) {}

  /** Responses stored now. */
  get size(): number {
    return this.#entries.size;
  }

  /** Stores response `id` of `key`: its whole conversation (output last) and its output items. */
  put(key: string, id: string, conversation: Json[], items: Json[]): void {
    while (this.#entries.size >= this.max) this.#evict(this.#entries.keys().next().value!);
    const slot = `${key}\0${id}`;
    this.#entries.set(slot, { key, conversation, items });
    for (const item of items) if (typeof item.id === "string") this.#items.set(`${key}\0${item.id}`, slot);
  }

  #evict(slot: string): void {
    const e = this.#entries.get(slot)!;
    this.#entries.delete(slot);
    for (const item of e.items) {
      const k = `${e.key}\0${item.id}`;
      if (this.#items.get(k) === slot) this.#items.delete(k);
    }
  }

  #use(slot: string): Entry | undefined {
    const e = this.#entries.get(slot);
    if (e) this.#entries.delete(slot), this.#entries.set(slot, e);
    return e;
  }

  /** What a request made with `key` may reach. */
  lookup(key: string): StoredLookup {
    return {
      conversation: (id) => this.#use(`${key}\0${id}`)?.conversation.map((m) => structuredClone(m)),
      item: (id) => {
        const slot = this.#items.get(`${key}\0${id}`);
        const found = slot === undefined ? undefined : this.#use(slot)?.items.find((i) => i.id === id);
        return found && structuredClone(found);
      },
    };
  }
}
