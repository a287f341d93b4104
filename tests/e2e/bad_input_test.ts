/**
 * Bad input gets its documented exit code and a clear one-line message, never a stack
 * trace or a wrong token. Each case runs the CLI as a subprocess on a damaged copy of the
 * tiny model.
 */

import assert from "node:assert/strict";
import { k3, tempDir, TINY } from "../helpers.ts";
import { assertRefused, editHeader, runDamaged, shards, shardWith } from "../damage.ts";

Deno.test("truncated shard: exit 1 naming the file", async () => {
  const out = await runDamaged(async (dir) => {
    const file = (await shards(dir))[1];
    const size = (await Deno.stat(file)).size;
    await Deno.truncate(file, size - 1000);
  });
  assertRefused(
    out,
    1,
    /model-00002-of-00003\.safetensors: shorter than its header says: .* fetch it again \(k3 pull\)/,
  );
});

Deno.test("missing shard: the missing tensor names the shard the index puts it in", async () => {
  const out = await runDamaged(async (dir) => {
    await Deno.remove((await shards(dir))[2]);
  });
  assertRefused(
    out,
    1,
    /missing tensor .* \(model\.safetensors\.index\.json puts it in model-00003-of-00003\.safetensors, which is missing: fetch it with k3 pull\)/,
  );
});

Deno.test("header pointing past the end of the file: exit 1 naming file and tensor", async () => {
  let victim = "";
  const out = await runDamaged(async (dir) => {
    const { file, name } = await shardWith(dir, /layers\.2\.self_attn\.q_proj\.weight$/);
    victim = name;
    await editHeader(file, (h) => {
      h[name].data_offsets[1] += 1 << 30;
    });
  });
  assertRefused(out, 1, new RegExp(`tensor ${victim.replaceAll(".", "\\.")}`));
});

Deno.test("header length larger than the file: exit 1", async () => {
  const out = await runDamaged(async (dir) => {
    const file = (await shards(dir))[0];
    const bytes = await Deno.readFile(file);
    new DataView(bytes.buffer).setBigUint64(0, 1n << 40n, true);
    await Deno.writeFile(file, bytes);
  });
  assertRefused(out, 1, /header length \d+ does not fit/);
});

Deno.test("wrong dtype for a tensor: exit 1 naming the tensor", async () => {
  const out = await runDamaged(async (dir) => {
    const { file, name } = await shardWith(dir, /layers\.1\.self_attn\.k_proj\.weight$/);
    await editHeader(file, (h) => {
      h[name].dtype = "I16";
    });
  });
  assertRefused(out, 1, /tensor language_model\.model\.layers\.1\.self_attn\.k_proj\.weight: dtype I16/);
});

Deno.test("size not matching dtype x shape: exit 1", async () => {
  const out = await runDamaged(async (dir) => {
    const { file, name } = await shardWith(dir, /layers\.1\.self_attn\.k_proj\.weight$/);
    await editHeader(file, (h) => {
      h[name].dtype = "F32";
    });
  });
  assertRefused(out, 1, /needs \d+/);
});

Deno.test("missing tensor: exit 1 naming it", async () => {
  const out = await runDamaged(async (dir) => {
    const { file, name } = await shardWith(dir, /layers\.5\.block_sparse_moe\.gate\.weight$/);
    await editHeader(file, (h) => {
      h[name + ".renamed"] = h[name];
      delete h[name];
    });
  });
  assertRefused(out, 1, /missing tensor language_model\.model\.layers\.5\.block_sparse_moe\.gate\.weight/);
});

Deno.test("overlapping tensors and duplicate names across shards: exit 1", async () => {
  const overlap = await runDamaged(async (dir) => {
    const file = (await shards(dir))[0];
    await editHeader(file, (h) => {
      const names = Object.keys(h).filter((n) => n !== "__metadata__").sort((a, b) =>
        h[a].data_offsets[0] - h[b].data_offsets[0]
      );
      const [a, b] = [h[names[0]], h[names[1]]];
      const len = b.data_offsets[1] - b.data_offsets[0];
      if (a.data_offsets[1] - a.data_offsets[0] < 2) throw new Error("fixture: first tensor too small");
      b.data_offsets = [a.data_offsets[0] + 1, a.data_offsets[0] + 1 + len];
    });
  });
  assertRefused(overlap, 1, /overlaps/);
  const dup = await runDamaged(async (dir) => {
    const [first, second] = await shards(dir);
    let taken = "";
    await editHeader(first, (h) => {
      taken = Object.keys(h).find((n) => n !== "__metadata__")!;
    });
    await editHeader(second, (h) => {
      const other = Object.keys(h).find((n) => n !== "__metadata__")!;
      h[taken] = h[other];
      delete h[other];
    });
  });
  assertRefused(dup, 1, /also in/);
});

Deno.test("NaN in the weights: output unsound, exit 4, no ids printed", async () => {
  const out = await runDamaged(async (dir) => {
    const { file, name } = await shardWith(dir, /^language_model\.model\.norm\.weight$/);
    const bytes = await Deno.readFile(file);
    const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    const entry = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)))[name];
    assert.equal(entry.dtype, "BF16");
    // bf16 0x7FC0 is a quiet NaN: the final norm's first gain becomes NaN.
    new DataView(bytes.buffer).setUint16(8 + n + entry.data_offsets[0], 0x7fc0, true);
    await Deno.writeFile(file, bytes);
  });
  // The plan and table header come first; the error is the last line, and no ids are printed.
  assert.equal(out.code, 4, out.stderr);
  assert.match(out.stderr.trim().split("\n").at(-1)!, /^k3: output unsound: logit \d+ is NaN at step 0/);
  assert.doesNotMatch(out.stderr, /\s+at .*:\d+:\d+/, "no stack trace");
  assert.equal(out.stdout.trim(), "", "no generated ids");
});

Deno.test("config without a field: exit 2 naming it", async () => {
  const out = await runDamaged(async (dir) => {
    const cfg = JSON.parse(await Deno.readTextFile(`${dir}/config.json`));
    delete cfg.text_config.hidden_size;
    delete cfg.text_config.linear_attn_config.gate_lower_bound;
    await Deno.writeTextFile(`${dir}/config.json`, JSON.stringify(cfg));
  });
  assertRefused(
    out,
    2,
    /text_config\.hidden_size is missing.*text_config\.linear_attn_config\.gate_lower_bound is missing/,
  );
});

Deno.test("config with a mistyped field, unreadable JSON, zero-based layer list: exit 2", async () => {
  const mistyped = await runDamaged(async (dir) => {
    const cfg = JSON.parse(await Deno.readTextFile(`${dir}/config.json`));
    cfg.text_config.num_experts = "8";
    await Deno.writeTextFile(`${dir}/config.json`, JSON.stringify(cfg));
  });
  assertRefused(mistyped, 2, /text_config\.num_experts: expected an integer/);
  const garbage = await runDamaged(async (dir) => {
    await Deno.writeTextFile(`${dir}/config.json`, "{ not json");
  });
  assertRefused(garbage, 2, /invalid JSON/);
  const zeroBased = await runDamaged(async (dir) => {
    const cfg = JSON.parse(await Deno.readTextFile(`${dir}/config.json`));
    const lin = cfg.text_config.linear_attn_config;
    lin.full_attn_layers = lin.full_attn_layers.map((x: number) => x - 1);
    lin.kda_layers = lin.kda_layers.map((x: number) => x - 1);
    await Deno.writeTextFile(`${dir}/config.json`, JSON.stringify(cfg));
  });
  assertRefused(zeroBased, 2, /one-based/);
});

Deno.test("usage errors: exit 2 with one line", async () => {
  const cases: [string[], RegExp][] = [
    [["run", TINY, "--ids", "1,2,1024"], /id 1024 is outside the vocabulary/],
    [["run", TINY, "--ids", "1,x"], /expected comma-separated token ids/],
    [["run", TINY], /a prompt is required/],
    [["run", TINY, "--ids", "1", "--gen", "0"], /--gen: 0 is out of range/],
    [["run", TINY, "--ids", "1", "--bogus"], /unknown option --bogus; see k3 run --help/],
    [["run", TINY, "--ids"], /argument missing/],
    [["run", "--ids", "1"], /exactly one <model_dir>/],
    [["frobnicate"], /unknown command "frobnicate"/],
    [["run", `${TINY}/nope`, "--ids", "1"], /nope: no such directory \(expected a model directory\)/],
  ];
  for (const [args, pattern] of cases) assertRefused(await k3(args), 2, pattern);
});

Deno.test("k3 run prints ids and writes the --out report atomically", async () => {
  await using dir = await tempDir();
  const out = await k3(["run", TINY, "--ids", "1,2,3", "--gen", "3", "--incremental", "--out", `${dir.path}/r.json`]);
  assert.equal(out.code, 0, out.stderr);
  const report = JSON.parse(await Deno.readTextFile(`${dir.path}/r.json`));
  assert.deepEqual(report.prompt_ids, [1, 2, 3]);
  assert.equal(out.stdout, report.generated_text + "\n", "stdout: the text");
  assert.equal(report.finish_reason, "length");
  assert.equal(report.generated_ids.length, 3);
  assert.ok(report.seconds_per_token > 0);
  assert.ok(report.peak_rss_bytes > 1e6);
  const names = [...Deno.readDirSync(dir.path)].map((e) => e.name);
  assert.deepEqual(names, ["r.json"], "no temporary file left behind");
});
