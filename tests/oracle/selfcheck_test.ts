// Runs the Python oracle self-checks (tests/oracle/selfcheck.py): MXFP4 hand values, KDA
// step == closed form, one-based layer map, and that the committed tiny reference fixtures
// still match a fresh float64 run.
Deno.test("oracle selfcheck.py", async () => {
  const dir = new URL(".", import.meta.url).pathname;
  const out = await new Deno.Command("python3", {
    args: [dir + "selfcheck.py"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (out.code !== 0) {
    const dec = new TextDecoder();
    throw new Error(
      "selfcheck.py failed:\n" + dec.decode(out.stdout) + dec.decode(out.stderr),
    );
  }
});
