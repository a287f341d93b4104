/**
 * Numbers in tool declarations are written as the released encoder (Python's `json.dumps`)
 * writes them. The goldens are CPython 3.11's `json.dumps(json.loads(literal))`.
 *
 * @module
 */

import assert from "node:assert/strict";
import { parseJson, pythonFloat, pythonNumber } from "../../engine/text/json_numbers.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { renderChatBody } from "../../cli/chat_render.ts";
import { TINY } from "../helpers.ts";

/** [JSON literal, CPython 3.11 json.dumps(json.loads(literal))]. */
const PYTHON: [string, string][] = [
  ["1.0", "1.0"],
  ["1e-7", "1e-07"],
  ["1E-7", "1e-07"],
  ["0.0001", "0.0001"],
  ["0.00001", "1e-05"],
  ["1e16", "1e+16"],
  ["1e15", "1000000000000000.0"],
  ["123456789012345678.0", "1.2345678901234568e+17"],
  ["-2.5", "-2.5"],
  ["0.1", "0.1"],
  ["100", "100"],
  ["-0", "0"],
  ["-0.0", "-0.0"],
  ["12345678901234567890", "12345678901234567890"],
  ["1.5e300", "1.5e+300"],
  ["5e-324", "5e-324"],
  ["3.0e2", "300.0"],
  ["1234.5678", "1234.5678"],
  ["9007199254740993", "9007199254740993"],
];

Deno.test("json numbers: each literal is written as Python's json.dumps writes what it parses to", () => {
  for (const [literal, python] of PYTHON) {
    const v = parseJson(`{"x":${literal}}`) as { x: number };
    assert.equal(pythonNumber(v, "x", v.x), python, literal);
    const a = parseJson(`[${literal}]`) as number[];
    assert.equal(pythonNumber(a, "0", a[0]), python, `[${literal}]`);
  }
  // Numbers made in code (no literal): integers as integers, others as Python floats.
  assert.equal(pythonNumber({}, "x", 3), "3");
  assert.equal(pythonNumber({}, "x", 0.5), "0.5");
  assert.equal(pythonFloat(1e-5), "1e-05");
});

Deno.test("json numbers: a tool declaration's floats render as the encoder writes them", () => {
  const tok = Tokenizer.load(TINY);
  const body = parseJson(
    JSON.stringify({ messages: [{ role: "user", content: "hi" }] }).replace(
      /}$/,
      ',"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":' +
        '{"t":{"type":"number","minimum":1.0,"maximum":1e-7},"n":{"type":"integer","maximum":12345678901234567890}}}}}]}',
    ),
  );
  const text = tok.decode(renderChatBody(tok, body).ids);
  assert.match(text, /"maximum":1e-07,"minimum":1\.0,/, text);
  assert.match(text, /"maximum":12345678901234567890\b/, text);
});
