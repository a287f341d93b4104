/**
 * The one JSON field reader (engine/json_fields.ts): each problem names its field by path,
 * says what was expected and what was there; a "missing" reader reports absent fields, an
 * "optional" one reads them (and null fields, not null array items) as undefined.
 */

import assert from "node:assert/strict";
import { type FieldOptions, hexDigits, JsonFields, problemText } from "../../engine/json_fields.ts";

/** A reader of `value` that collects its problems as text. */
function reader(value: unknown, absent: FieldOptions["absent"] = "missing") {
  const problems: string[] = [];
  const fields = JsonFields.root(value, { absent, report: (p) => void problems.push(problemText(p)) }, "model");
  return { fields, problems };
}

Deno.test("json fields: a problem names the field's path, what was expected and what was there", () => {
  const { fields, problems } = reader({
    layers: [{ experts: "x" }, { experts: 8 }],
    eps: 0,
    scale: 1000,
    kind: "mla",
    hash: "00ff",
    ok: 1,
    long: "a".repeat(100),
  });
  const layers = fields!.array("layers", { maxLength: 2 })!;
  assert.equal(layers.object(0)!.int("experts", 1, 4096), undefined);
  assert.equal(layers.object(1)!.int("experts", 1, 4096), 8);
  assert.equal(fields!.number("eps", { min: 0, max: 1, minOpen: true }), undefined);
  assert.equal(fields!.number("scale", { min: 0, max: 1000, minOpen: true }), 1000);
  assert.equal(fields!.oneOf("kind", ["kda", "mla"]), "mla");
  assert.equal(fields!.string("hash", hexDigits(16)), undefined);
  assert.equal(fields!.boolean("ok"), undefined);
  assert.equal(fields!.string("long", hexDigits(16)), undefined);
  assert.equal(fields!.int("absent", 0), undefined);
  assert.equal(fields!.array("layers", { length: 3 }), undefined);
  assert.deepEqual(problems, [
    'model.layers[0].experts: expected an integer in 1..4096, got "x"',
    "model.eps: expected a number in (0, 1], got 0",
    'model.hash: expected 16 hex digits, got "00ff"',
    "model.ok: expected a boolean, got 1",
    `model.long: expected 16 hex digits, got "${"a".repeat(40)}"...`,
    "model.absent is missing (expected an integer >= 0)",
    "model.layers: expected an array of 3 items, got an array of 2 items",
  ]);
});

Deno.test("json fields: optional readers read absent and null fields as undefined, a null item as a value", () => {
  const { fields, problems } = reader({ a: null, list: [1, null] }, "optional");
  assert.equal(fields!.string("a"), undefined);
  assert.equal(fields!.int("b"), undefined);
  assert.equal(fields!.has("a"), false);
  const list = fields!.array("list")!;
  assert.equal(list.int(0), 1);
  assert.equal(list.int(1), undefined);
  assert.deepEqual(problems, ["model.list[1]: expected an integer, got null"]);
  // A "missing" reader: null is a value, not an absent field.
  const strict = reader({ a: null });
  assert.equal(strict.fields!.string("a"), undefined);
  assert.deepEqual(strict.problems, ["model.a: expected a string, got null"]);
});

Deno.test("json fields: a root that is not an object is reported, and a report that throws stops the read", () => {
  assert.deepEqual(reader([1]).problems, ["model: expected an object, got an array of 1 item"]);
  const stop: FieldOptions = {
    absent: "missing",
    report: (p) => {
      throw new Error(problemText(p));
    },
  };
  const fields = JsonFields.root({ n: 2.5 }, stop)!;
  assert.throws(() => fields.int("n"), /^Error: n: expected an integer, got 2\.5$/);
});
