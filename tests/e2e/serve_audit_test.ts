/**
 * Two of the hostile audit's repros (issue 35) against a real `k3 serve` process, beside
 * the transport-level tests of tests/unit/http1_audit_test.ts: clients that pipeline
 * `/health` and never read no longer hold every connection of `--max-connections`, and
 * one such client no longer keeps the server running past `--grace` after SIGTERM.
 *
 * @module
 */

import assert from "node:assert/strict";
import { K3Process, TINY } from "../helpers.ts";

const READY = /k3: ready: (http:\/\/127\.0\.0\.1:(\d+))\/v1/;

/** A client that pipelines `/health` requests (16 MB of them) and never reads a byte. */
async function nonReader(port: number): Promise<Deno.TcpConn> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const many = new TextEncoder().encode(`GET /health HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\n\r\n`.repeat(400_000));
  conn.write(many).catch(() => {}); // never completes while the server reads no more
  return conn;
}

/** The /health log lines so far. */
const healthLines = (stderr: string) => (stderr.match(/ GET \/health 200 /g) ?? []).length;

Deno.test("serve: clients that never read are cut off at --send-timeout; new connections are served again", async () => {
  const server = new K3Process(["serve", TINY, "--port", "0", "--max-connections", "3", "--send-timeout", "1"]);
  const [, url, port] = await server.waitFor(READY);
  const clients = await Promise.all([0, 1, 2].map(() => nonReader(Number(port))));
  try {
    // Every slot taken, and each client's answers written until its socket is full.
    await server.until("answers to the pipelined requests", (s) => healthLines(s) >= 3000);
    let status = 0;
    while (status !== 200) {
      const res = await fetch(`${url}/health`).catch(() => undefined);
      status = res?.status ?? 0;
      await res?.body?.cancel();
      if (status !== 200) await new Promise((r) => setTimeout(r, 200));
    }
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.ok(Number(/^k3_send_timeouts_total (\d+)$/m.exec(metrics)?.[1]) >= 1, metrics);
  } finally {
    for (const c of clients) c.close();
    server.child.kill("SIGTERM");
    await server.exit();
  }
});

Deno.test("serve: SIGTERM with --grace 2 ends the server while a client that never reads holds its connection", async () => {
  // A send timeout longer than the test: only the grace period can end that connection.
  const server = new K3Process(["serve", TINY, "--port", "0", "--grace", "2", "--send-timeout", "600"]);
  const [, , port] = await server.waitFor(READY);
  const client = await nonReader(Number(port));
  let clientClosed = false;
  // The guard only keeps a regression from hanging the suite: the assertion is the order.
  const guard = setTimeout(() => (clientClosed = true, client.close()), 60_000);
  try {
    await server.until("answers to the pipelined requests", (s) => healthLines(s) >= 1000);
    server.child.kill("SIGTERM");
    const status = await server.exit();
    assert.equal(clientClosed, false, "the server waited for the client to go");
    assert.equal(status.code, 0, server.stderr);
  } finally {
    clearTimeout(guard);
    if (!clientClosed) client.close();
  }
});
