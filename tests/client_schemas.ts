/**
 * The schemas the client tests send. The zod 4 schema the client tests (tests/e2e/langchain_agents_test.ts and its child,
 * tests/agents_sdk_child.ts) send as their users write it: `.int()`, `.email()`, `.min()`,
 * `.regex()`, an optional, a nullable, an enum and nested arrays, bounded where the tiny
 * model's random weights would otherwise never end a string or an array.
 *
 * @module
 */

import { z } from "zod";

/** A contact, as a user of LangChain or the Agents SDK would describe one. */
export const Contact = z.object({
  id: z.number().int(),
  age: z.number().int().min(0).max(120),
  email: z.string().email().max(24),
  code: z.string().regex(/^[A-Z]{2}-\d{3}$/),
  name: z.string().min(1).max(10),
  nickname: z.string().max(6).optional(),
  note: z.string().max(8).nullable(),
  color: z.enum(["red", "green", "blue"]),
  grid: z.array(z.array(z.number().int().min(0).max(9)).max(3)).max(2),
});

/**
 * The same with the optional field nullable instead: what OpenAI's strict helpers accept.
 * The Agents SDK converts a schema with `.optional()` by its own fallback, which drops every
 * check (`.int()`, `.email()`, `.max()`, `.regex()`), so the schema it sends allows objects
 * its own zod parse then refuses.
 */
export const StrictContact = Contact.extend({ nickname: z.string().max(6).nullable() });

/** A forced tool's arguments, bounded so that a call or an object fits in a few dozen tokens
 * after the reasoning (the reasoning-budget tests send it through every client and `k3 batch`). */
export const LOOKUP = {
  type: "object",
  properties: {
    word: { type: "string", maxLength: 6 },
    limit: { type: "integer", minimum: 1, maximum: 9 },
    kind: { enum: ["noun", "verb"] },
  },
  required: ["word", "limit", "kind"],
  additionalProperties: false,
} as const;
