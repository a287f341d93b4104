/**
 * Kernel library tests.
 *
 * (a) Determinism: every SIMD build (avx2, avx512, the native libk3) gives the same bytes as
 *     the scalar build on random inputs of awkward sizes; batching tokens and splitting row
 *     or head ranges never changes a bit.
 * (b) Accuracy: each op against a float64 reference, both an in-test one on random inputs
 *     and the independent NumPy fixture tests/fixtures/ops.json (which must exist).
 *
 * @module
 */
import { symbols } from "../../engine/native/symbols.ts";
import { libraryBuilds } from "../helpers.ts";

/** k3_mla_attend_rows shapes at its tiles' edges: [heads, kvheads, dn, dr, dv, npos, rows,
 * h0, h1]: npos 0, rows and heads not a multiple of a tile, h0 > 0, positions across one and
 * two blocks, partial blocks of 16, per-head keys. */
const MLA_EDGES = [
  [7, 1, 40, 8, 40, 0, 5, 0, 7],
  [6, 1, 20, 5, 36, 70, 3, 1, 6],
  [3, 3, 17, 4, 15, 9, 6, 0, 3],
  [5, 1, 64, 64, 64, 130, 2, 2, 5],
];

type Lib = Deno.DynamicLibrary<typeof symbols>;
type K = Lib["symbols"];

const FIXTURE = new URL("../fixtures/ops.json", import.meta.url).pathname;

// ------------------------------------------------------------------ setup

// Local assertions: the tests run offline, with no remote std imports.
function assert(c: unknown, msg = "assertion failed"): asserts c {
  if (!c) throw new Error(msg);
}
function assertEquals<T>(a: T, b: T, msg = ""): void {
  if (a !== b) throw new Error(`${msg}: ${a} !== ${b}`);
}

/** Scalar plus every other build present (avx2, avx512 where this CPU runs them, native). */
function loadLibs(): { scalar: K; others: [string, K][]; close: () => void } {
  const builds = libraryBuilds(symbols);
  const [[first, scalar], ...rest] = builds;
  assertEquals(first, "scalar", "the first build");
  return {
    scalar: scalar.symbols,
    others: rest.map(([name, l]): [string, K] => [name, l.symbols]),
    close: () => builds.forEach(([, l]) => l.close()),
  };
}

function isa(k: K): string {
  const p = k.k3_isa();
  return p ? new Deno.UnsafePointerView(p).getCString() : "?";
}

// deno-lint-ignore no-explicit-any
const P = (a: any): Deno.PointerValue => (a ? Deno.UnsafePointer.of(a) : null);

/** Deterministic PRNG (mulberry32). */
function rng(seed: number) {
  let s = seed >>> 0;
  const next = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    f32(n: number, scale = 1): Float32Array {
      const a = new Float32Array(n);
      for (let i = 0; i < n; i++) a[i] = (next() * 2 - 1) * scale;
      return a;
    },
    u8(n: number): Uint8Array {
      const a = new Uint8Array(n);
      for (let i = 0; i < n; i++) a[i] = (next() * 256) | 0;
      return a;
    },
    /** bf16 bit patterns of random values in (-scale, scale). */
    bf16(n: number, scale = 1): Uint16Array {
      const f = this.f32(n, scale);
      const u = new Uint32Array(f.buffer);
      const a = new Uint16Array(n);
      for (let i = 0; i < n; i++) a[i] = u[i] >>> 16;
      return a;
    },
    /** MXFP4 scale bytes near 127, with some 0 (subnormal 2^-127) and 255 (zero group). */
    scales(n: number): Uint8Array {
      const a = new Uint8Array(n);
      for (let i = 0; i < n; i++) {
        const r = next();
        a[i] = r < 0.05 ? 255 : r < 0.08 ? 0 : 120 + ((next() * 14) | 0);
      }
      return a;
    },
  };
}

const bytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
function sameBytes(a: ArrayBufferView, b: ArrayBufferView, what: string): void {
  const x = bytes(a), y = bytes(b);
  assertEquals(x.length, y.length, what);
  for (let i = 0; i < x.length; i++) {
    if (x[i] !== y[i]) {
      const fi = Math.floor(i / 4);
      const fa = new Float32Array(x.buffer, x.byteOffset, x.length >> 2)[fi];
      const fb = new Float32Array(y.buffer, y.byteOffset, y.length >> 2)[fi];
      throw new Error(`${what}: differs at float ${fi}: ${fa} vs ${fb}`);
    }
  }
}

const bf16ToF64 = (h: number) => new Float32Array(new Uint32Array([h << 16]).buffer)[0];
const E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];
const sig = (x: number) => 1 / (1 + Math.exp(-x));

// ------------------------------------------------------------------ kernel cases
// Each case runs on a given library and returns its output buffers (fresh copies of the
// inputs it mutates), so the same case can be run on every build and compared bytewise.

type Out = ArrayBufferView[];
interface Case {
  name: string;
  run: (k: K) => Out;
  /** float64 reference of the same outputs, with per-element tolerance. */
  ref?: () => { want: number[][]; atol: number; rtol: number };
}

const COLS = [1, 15, 16, 17, 33, 1000, 7168];

function matmulCases(seed: number): Case[] {
  const cases: Case[] = [];
  const r = rng(seed);
  for (const cols of COLS) {
    for (const wtype of [0, 1]) {
      // 1: the one-token path; 2, 5, 11: tiles of 4 tokens with 2, 1 and 3 left over
      for (const ntok of [1, 2, 5, 11]) {
        const rows = cols >= 1000 ? 9 : 13;
        const wf = wtype === 0 ? r.f32(rows * cols) : r.bf16(rows * cols);
        const x = r.f32(ntok * cols);
        const ranges: [number, number][] = [[0, rows], [1, rows - 1], [3, 4]];
        for (const [r0, r1] of ranges) {
          cases.push({
            name: `matmul ${wtype ? "bf16" : "f32"} ${rows}x${cols} ntok=${ntok} [${r0},${r1})`,
            run: (k) => {
              const y = new Float32Array(ntok * rows).fill(7);
              k.k3_matmul(P(wf), wtype, P(x), P(y), ntok, rows, cols, r0, r1);
              return [y];
            },
            ref: () => {
              const want: number[] = [];
              let mag = 0;
              for (let t = 0; t < ntok; t++) {
                for (let rr = 0; rr < rows; rr++) {
                  if (rr < r0 || rr >= r1) {
                    want.push(7);
                    continue;
                  }
                  let s = 0;
                  for (let c = 0; c < cols; c++) {
                    const w = wtype ? bf16ToF64(wf[rr * cols + c]) : wf[rr * cols + c];
                    s += w * x[t * cols + c];
                    mag = Math.max(mag, Math.abs(w * x[t * cols + c]));
                  }
                  want.push(s);
                }
              }
              // f32 summation of `cols` terms: error grows like sqrt(cols) * 2^-24 * |term|.
              return { want: [want], atol: 1e-6 + 4e-7 * Math.sqrt(cols) * mag * 4, rtol: 1e-5 };
            },
          });
        }
      }
    }
  }
  return cases;
}

function mxfp4Ref(
  packed: Uint8Array,
  scales: Uint8Array,
  x: Float32Array,
  ntok: number,
  rows: number,
  cols: number,
): number[] {
  const out: number[] = [];
  for (let t = 0; t < ntok; t++) {
    for (let r = 0; r < rows; r++) {
      let s = 0;
      for (let c = 0; c < cols; c++) {
        const sc = scales[r * (cols / 32) + (c >> 5)];
        if (sc === 255) continue;
        const b = packed[r * (cols / 2) + (c >> 1)];
        const nib = c & 1 ? b >> 4 : b & 15;
        s += E2M1[nib] * 2 ** (sc - 127) * x[t * cols + c];
      }
      out.push(s);
    }
  }
  return out;
}

function mxfp4Cases(seed: number): Case[] {
  const cases: Case[] = [];
  const r = rng(seed);
  for (const cols of [32, 64, 96, 1024, 3584]) {
    for (const ntok of [1, 5, 11]) {
      const rows = 11;
      const packed = r.u8(rows * cols / 2), scales = r.scales(rows * cols / 32);
      const x = r.f32(ntok * cols);
      for (const [r0, r1] of [[0, rows], [2, 9], [5, 6]]) {
        cases.push({
          name: `mxfp4 ${rows}x${cols} ntok=${ntok} [${r0},${r1})`,
          run: (k) => {
            const y = new Float32Array(ntok * rows).fill(7);
            k.k3_matmul_mxfp4(P(packed), P(scales), P(x), P(y), ntok, rows, cols, r0, r1);
            return [y];
          },
          ref: () => {
            const full = mxfp4Ref(packed, scales, x, ntok, rows, cols);
            const want = full.map((v, i) => (i % rows >= r0 && i % rows < r1 ? v : 7));
            return { want: [want], atol: 1e-5 * Math.sqrt(cols) * 2 ** 6 * 6, rtol: 1e-5 };
          },
        });
      }
    }
  }
  return cases;
}

function rmsRef(
  x: ArrayLike<number>,
  w: ArrayLike<number> | null,
  n: number,
  g: number,
  eps: number,
) {
  const out: number[] = [];
  for (let j = 0; j < g; j++) {
    let ss = 0;
    for (let i = 0; i < n; i++) ss += x[j * n + i] ** 2;
    const r = Math.sqrt(ss / n + eps);
    for (let i = 0; i < n; i++) out.push((x[j * n + i] / r) * (w ? w[i] : 1));
  }
  return out;
}

function miscCases(seed: number): Case[] {
  const r = rng(seed);
  const cases: Case[] = [];
  for (const n of COLS) {
    const ng = 3;
    const x = r.f32(n * ng, 3), w = r.f32(n, 2);
    for (const useW of [true, false]) {
      cases.push({
        name: `rmsnorm n=${n} w=${useW}`,
        run: (k) => {
          const y = new Float32Array(n * ng);
          k.k3_rmsnorm(P(x), useW ? P(w) : null, P(y), n, ng, 1e-5);
          return [y];
        },
        ref: () => ({ want: [rmsRef(x, useW ? w : null, n, ng, 1e-5)], atol: 1e-6, rtol: 1e-5 }),
      });
    }
    cases.push({
      name: `rmsnorm in place n=${n}`,
      run: (k) => {
        const y = x.slice();
        k.k3_rmsnorm(P(y), P(w), P(y), n, ng, 1e-5);
        return [y];
      },
    });
    cases.push({
      name: `l2norm d=${n}`,
      run: (k) => {
        const y = x.slice();
        k.k3_l2norm(P(y), n, ng, 1e-6);
        return [y];
      },
      ref: () => {
        const want: number[] = [];
        for (let h = 0; h < ng; h++) {
          let ss = 0;
          for (let i = 0; i < n; i++) ss += x[h * n + i] ** 2;
          for (let i = 0; i < n; i++) want.push(x[h * n + i] / Math.sqrt(ss + 1e-6));
        }
        return { want: [want], atol: 1e-7, rtol: 1e-5 };
      },
    });
    const g = r.f32(n, 12), u = r.f32(n, 60);
    cases.push({
      name: `situ_glu n=${n}`,
      run: (k) => {
        const o = new Float32Array(n);
        k.k3_situ_glu(P(g), P(u), P(o), n, 4, 25);
        return [o];
      },
      ref: () => ({
        want: [
          Array.from(g, (gi, i) => 4 * Math.tanh(gi / 4) * sig(gi) * 25 * Math.tanh(u[i] / 25)),
        ],
        atol: 1e-5,
        rtol: 1e-5,
      }),
    });
    cases.push({
      name: `sigmoid, sigmoid_mul, add, axpy n=${n}`,
      run: (k) => {
        const s = new Float32Array(n), m = u.slice(), a = u.slice(), b = u.slice();
        k.k3_sigmoid(P(g), P(s), n);
        k.k3_sigmoid_mul(P(m), P(g), n);
        k.k3_add(P(a), P(g), n);
        k.k3_axpy(P(b), 0.37, P(g), n);
        return [s, m, a, b];
      },
      ref: () => ({
        want: [
          Array.from(g, sig),
          Array.from(u, (v, i) => v * sig(g[i])),
          Array.from(u, (v, i) => v + g[i]),
          Array.from(u, (v, i) => v + Math.fround(0.37) * g[i]),
        ],
        atol: 1e-5,
        rtol: 1e-6,
      }),
    });
    const h16 = new Uint16Array(n);
    for (let i = 0; i < n; i++) h16[i] = (r.next() * 65536) | 0;
    cases.push({
      name: `bf16/f16 to f32 n=${n}`,
      run: (k) => {
        const a = new Float32Array(n), b = new Float32Array(n);
        k.k3_bf16_to_f32(P(h16), P(a), n);
        k.k3_f16_to_f32(P(h16), P(b), n);
        return [a, b];
      },
    });
    cases.push({
      name: `argmax n=${n}`,
      run: (k) => [new Int32Array([k.k3_argmax(P(x), n)])],
      ref: () => {
        let b = 0;
        for (let i = 1; i < n; i++) if (x[i] > x[b]) b = i;
        return { want: [[b]], atol: 0, rtol: 0 };
      },
    });
  }
  // short conv
  for (const ch of [1, 17, 12288]) {
    const st = r.f32(ch * 3), w = r.f32(ch * 4), x = r.f32(ch, 2);
    cases.push({
      name: `short_conv ch=${ch}`,
      run: (k) => {
        const s = st.slice(), y = new Float32Array(ch);
        k.k3_short_conv(P(s), P(w), P(x), P(y), ch);
        return [y, s];
      },
      ref: () => {
        const y: number[] = [], s: number[] = [];
        for (let c = 0; c < ch; c++) {
          const z = w[4 * c] * st[3 * c] + w[4 * c + 1] * st[3 * c + 1] +
            w[4 * c + 2] * st[3 * c + 2] +
            w[4 * c + 3] * x[c];
          y.push(z * sig(z));
          s.push(st[3 * c + 1], st[3 * c + 2], x[c]);
        }
        return { want: [y, s], atol: 1e-6, rtol: 1e-5 };
      },
    });
  }
  // kda decay
  for (const [nh, d] of [[3, 17], [2, 128]]) {
    const f = r.f32(nh * d, 3), al = r.f32(nh), dt = r.f32(nh * d);
    cases.push({
      name: `kda_decay ${nh}x${d}`,
      run: (k) => {
        const a = new Float32Array(nh * d);
        k.k3_kda_decay(P(f), P(al), P(dt), P(a), nh, d, -5);
        return [a];
      },
      ref: () => {
        const want: number[] = [];
        for (let h = 0; h < nh; h++) {
          for (let i = 0; i < d; i++) {
            want.push(Math.exp(-5 * sig(Math.exp(al[h]) * (f[h * d + i] + dt[h * d + i]))));
          }
        }
        return { want: [want], atol: 1e-7, rtol: 1e-5 };
      },
    });
  }
  // router
  for (const [ne, kk] of [[896, 16], [7, 3], [5, 5]]) {
    const logits = r.f32(ne, 4), bias = r.f32(ne, 0.1);
    if (ne === 7) bias.fill(0), logits.set([1, 2, 2, 0, 2, 1, 3]); // ties -> lowest index
    cases.push({
      name: `router_topk ${ne} k=${kk}`,
      run: (k) => {
        const ids = new Int32Array(kk), w = new Float32Array(kk);
        const n = k.k3_router_topk(P(logits), P(bias), ne, kk, 2.5, P(ids), P(w));
        return [new Int32Array([n]), ids, w];
      },
      ref: () => {
        const s = Array.from(logits, (l) => sig(Math.fround(l)));
        const key = s.map((v, i) => Math.fround(Math.fround(v) + bias[i]));
        const order = key.map((_, i) => i).sort((a, b) => key[b] - key[a] || a - b).slice(0, kk);
        const sum = order.reduce((a, i) => a + s[i], 0);
        return {
          want: [[kk], order, order.map((i) => (s[i] / (sum + 1e-20)) * 2.5)],
          atol: 1e-6,
          rtol: 1e-5,
        };
      },
    });
  }
  return cases;
}

function kdaRef(
  S0: Float32Array,
  q: Float32Array,
  kv: Float32Array,
  v: Float32Array,
  beta: Float32Array,
  alpha: Float32Array,
  d: number,
  nh: number,
  h0: number,
  h1: number,
) {
  const S = Array.from(S0), o = new Array(nh * d).fill(0);
  for (let h = h0; h < h1; h++) {
    const b = h * d * d;
    for (let i = 0; i < d; i++) for (let j = 0; j < d; j++) S[b + i * d + j] *= alpha[h * d + i];
    for (let j = 0; j < d; j++) {
      let u = 0;
      for (let i = 0; i < d; i++) u += S[b + i * d + j] * kv[h * d + i];
      const delta = beta[h] * (v[h * d + j] - u);
      for (let i = 0; i < d; i++) S[b + i * d + j] += kv[h * d + i] * delta;
      let oo = 0;
      for (let i = 0; i < d; i++) oo += S[b + i * d + j] * q[h * d + i] / Math.sqrt(d);
      o[h * d + j] = oo;
    }
  }
  return { S, o };
}

function unitRows(r: ReturnType<typeof rng>, nh: number, d: number) {
  const a = r.f32(nh * d);
  for (let h = 0; h < nh; h++) {
    let ss = 0;
    for (let i = 0; i < d; i++) ss += a[h * d + i] ** 2;
    for (let i = 0; i < d; i++) a[h * d + i] /= Math.sqrt(ss);
  }
  return a;
}

function attnCases(seed: number): Case[] {
  const r = rng(seed);
  const cases: Case[] = [];
  for (const d of [16, 17, 128, 300]) {
    const nh = 3;
    const S = r.f32(nh * d * d, 0.5), q = unitRows(r, nh, d), kk = unitRows(r, nh, d);
    const v = r.f32(nh * d), beta = Float32Array.from(r.f32(nh), (x) => sig(x));
    const alpha = Float32Array.from(r.f32(nh * d), (x) => Math.exp(-5 * sig(x * 3)));
    for (const [h0, h1] of [[0, nh], [1, 2]]) {
      cases.push({
        name: `kda_step d=${d} [${h0},${h1})`,
        run: (k) => {
          const s = S.slice(), o = new Float32Array(nh * d);
          k.k3_kda_step(P(s), P(q), P(kk), P(v), P(beta), P(alpha), P(o), d, h0, h1);
          return [s, o];
        },
        ref: () => {
          const { S: s, o } = kdaRef(S, q, kk, v, beta, alpha, d, nh, h0, h1);
          return { want: [s, o], atol: 2e-6 * Math.sqrt(d), rtol: 1e-5 };
        },
      });
    }
  }
  for (
    const [npos, dn, dr, dv] of [[1, 128, 64, 128], [7, 128, 64, 128], [5, 17, 5, 15], [
      40,
      33,
      16,
      1,
    ]]
  ) {
    const nh = 3, dq = dn + dr;
    const q = r.f32(nh * dq, 2), kn = r.f32(npos * nh * dn, 2), kr = r.f32(npos * dr, 2);
    const v = r.f32(npos * nh * dv);
    const scale = 1 / Math.sqrt(dq);
    for (const [h0, h1] of [[0, nh], [2, 3]]) {
      cases.push({
        name: `mla_attend npos=${npos} dn=${dn} dr=${dr} dv=${dv} [${h0},${h1})`,
        run: (k) => {
          const out = new Float32Array(nh * dv), sc = new Float32Array(nh * npos);
          k.k3_mla_attend(
            P(q),
            P(kn),
            P(kr),
            P(v),
            P(out),
            P(sc),
            npos,
            nh,
            nh,
            dn,
            dr,
            dv,
            scale,
            h0,
            h1,
          );
          // only heads in range are defined
          return [out.slice(h0 * dv, h1 * dv), sc.slice(h0 * npos, h1 * npos)];
        },
        ref: () => {
          const out: number[] = [], probs: number[] = [];
          for (let h = h0; h < h1; h++) {
            const sc: number[] = [];
            for (let s = 0; s < npos; s++) {
              let a = 0;
              for (let i = 0; i < dn; i++) a += q[h * dq + i] * kn[(s * nh + h) * dn + i];
              for (let i = 0; i < dr; i++) a += q[h * dq + dn + i] * kr[s * dr + i];
              sc.push(a * Math.fround(scale));
            }
            const m = Math.max(...sc);
            const e = sc.map((x) => Math.exp(x - m));
            const z = e.reduce((a, b) => a + b, 0);
            const p = e.map((x) => x / z);
            probs.push(...p);
            for (let j = 0; j < dv; j++) {
              let o = 0;
              for (let s = 0; s < npos; s++) o += p[s] * v[(s * nh + h) * dv + j];
              out.push(o);
            }
          }
          return { want: [out, probs], atol: 1e-5, rtol: 1e-4 };
        },
      });
    }
  }
  // MLA over a tile of query rows at the tiles' edges (4 x 4 score and output tiles on
  // AVX-512, 2 x 2 and 4 x 1 elsewhere, blocks of 64 positions): npos 0 (row 0 attends over
  // nothing), rows and heads not a multiple of a tile, h0 > 0, positions across one and two
  // blocks, widths with a partial block of 16 (dn, dr, dv) and a partial tile of columns,
  // per-head keys (kvheads > 1), and the released latent widths (dc 512, dr 64) over 8 heads.
  for (
    const [nh, kvh, dn, dr, dv, npos, nrows, h0, h1] of [...MLA_EDGES, [8, 1, 512, 64, 512, 61, 6, 0, 8]]
  ) {
    const last = npos + nrows - 1, dq = dn + dr, scale = 1 / Math.sqrt(dq);
    const q = r.f32(nrows * nh * dq, 2), kn = r.f32(last * kvh * dn, 2), kr = r.f32(last * dr, 2);
    const v = kvh === 1 && dv === dn ? kn : r.f32(last * kvh * dv);
    /** Row j's heads [h0, h1) of a [nrows][nh][width] array. */
    const inRange = (a: Float32Array, width: number) =>
      Float32Array.from({ length: nrows * (h1 - h0) * width }, (_, i) => {
        const j = Math.floor(i / ((h1 - h0) * width)), rest = i % ((h1 - h0) * width);
        return a[(j * nh + h0) * width + rest];
      });
    cases.push({
      name: `mla_attend_rows nh=${nh} kvh=${kvh} dn=${dn} dr=${dr} dv=${dv} npos=${npos} nrows=${nrows} [${h0},${h1})`,
      run: (k) => {
        const out = new Float32Array(nrows * nh * dv), sc = new Float32Array(nrows * nh * last + 1);
        k.k3_mla_attend_rows(P(q), P(kn), P(kr), P(v), P(out), P(sc), npos, nrows, nh, kvh, dn, dr, dv, scale, h0, h1);
        // row j's probabilities are the first npos + j of its heads' scores
        const probs = Float32Array.from(sc.subarray(0, nrows * nh * last)).map((x, i) =>
          i % last < npos + Math.floor(i / (nh * last)) ? x : 0
        );
        return [inRange(out, dv), inRange(probs, last)];
      },
      ref: () => {
        const out: number[] = [], probs: number[] = [];
        for (let j = 0; j < nrows; j++) {
          for (let h = h0; h < h1; h++) {
            const kh = kvh === 1 ? 0 : h, n = npos + j, sc: number[] = [];
            for (let s = 0; s < n; s++) {
              let a = 0;
              for (let i = 0; i < dn; i++) a += q[(j * nh + h) * dq + i] * kn[(s * kvh + kh) * dn + i];
              for (let i = 0; i < dr; i++) a += q[(j * nh + h) * dq + dn + i] * kr[s * dr + i];
              sc.push(a * Math.fround(scale));
            }
            const m = Math.max(...sc), e = sc.map((x) => Math.exp(x - m)), z = e.reduce((a, b) => a + b, 0);
            probs.push(...e.map((x) => x / z), ...new Array(last - n).fill(0));
            for (let c = 0; c < dv; c++) {
              let o = 0;
              for (let s = 0; s < n; s++) o += (e[s] / z) * v[(s * kvh + kh) * dv + c];
              out.push(o);
            }
          }
        }
        return { want: [out, probs], atol: 1e-5, rtol: 1e-4 };
      },
    });
  }
  for (const [nsrc, n] of [[1, 17], [3, 1000], [9, 7168], [5, 15]]) {
    const src = r.f32(nsrc * n, 3), nw = r.f32(n, 2), pw = r.f32(n, 0.05);
    cases.push({
      name: `attnres nsrc=${nsrc} n=${n}`,
      run: (k) => {
        const out = new Float32Array(n);
        k.k3_attnres(P(src), nsrc, n, P(nw), P(pw), 1e-5, P(out));
        return [out];
      },
      ref: () => {
        const sc: number[] = [];
        for (let i = 0; i < nsrc; i++) {
          let ss = 0, d = 0;
          for (let j = 0; j < n; j++) ss += src[i * n + j] ** 2;
          const rr = Math.sqrt(ss / n + 1e-5);
          for (let j = 0; j < n; j++) d += (src[i * n + j] / rr) * nw[j] * pw[j];
          sc.push(d);
        }
        const m = Math.max(...sc),
          e = sc.map((x) => Math.exp(x - m)),
          z = e.reduce((a, b) => a + b);
        const out: number[] = [];
        for (let j = 0; j < n; j++) {
          let o = 0;
          for (let i = 0; i < nsrc; i++) o += (e[i] / z) * src[i * n + j];
          out.push(o);
        }
        return { want: [out], atol: 1e-5, rtol: 1e-4 };
      },
    });
  }
  return cases;
}

/** The MLA latent form: MQA attention over shared latents, q absorption, value expansion. */
function mlaLatentCases(seed: number): Case[] {
  const cases: Case[] = [];
  const r = rng(seed);
  for (const [nh, dn, dr, dv, dc, npos] of [[3, 16, 8, 16, 32, 5], [2, 128, 64, 128, 512, 3], [4, 7, 3, 5, 17, 9]]) {
    for (const wtype of [0, 1]) {
      const kvb = wtype === 0 ? r.f32(nh * (dn + dv) * dc, 0.2) : r.bf16(nh * (dn + dv) * dc, 0.2);
      const w = (row: number, col: number) => (wtype ? bf16ToF64(kvb[row * dc + col]) : kvb[row * dc + col]);
      // Six query rows: a kernel block of four and a rest of two.
      const rows = 6, q = r.f32(rows * nh * (dn + dr), 2), olat = r.f32(nh * dc);
      for (const [h0, h1] of [[0, nh], [1, 2]]) {
        cases.push({
          name: `mla_absorb ${wtype ? "bf16" : "f32"} rows=${rows} nh=${nh} dn=${dn} dc=${dc} [${h0},${h1})`,
          run: (k) => {
            const qlat = new Float32Array(rows * nh * (dc + dr));
            k.k3_mla_absorb(P(kvb), wtype, P(q), P(qlat), rows, nh, dn, dr, dv, dc, h0, h1);
            const out: number[] = [];
            for (let t = 0; t < rows; t++) {
              out.push(...qlat.slice((t * nh + h0) * (dc + dr), (t * nh + h1) * (dc + dr)));
            }
            return [Float32Array.from(out)];
          },
          ref: () => {
            const want: number[] = [];
            for (let t = 0; t < rows; t++) {
              for (let h = h0; h < h1; h++) {
                const qh = (t * nh + h) * (dn + dr);
                for (let j = 0; j < dc; j++) {
                  let s = 0;
                  for (let i = 0; i < dn; i++) s += w(h * (dn + dv) + i, j) * q[qh + i];
                  want.push(s);
                }
                for (let j = 0; j < dr; j++) want.push(q[qh + dn + j]);
              }
            }
            return { want: [want], atol: 1e-5 * Math.sqrt(dn), rtol: 1e-4 };
          },
        });
        cases.push({
          name: `mla_expand ${wtype ? "bf16" : "f32"} nh=${nh} dv=${dv} dc=${dc} [${h0},${h1})`,
          run: (k) => {
            const out = new Float32Array(nh * dv);
            k.k3_mla_expand(P(kvb), wtype, P(olat), P(out), nh, dn, dv, dc, h0, h1);
            return [out.slice(h0 * dv, h1 * dv)];
          },
          ref: () => {
            const want: number[] = [];
            for (let h = h0; h < h1; h++) {
              for (let j = 0; j < dv; j++) {
                let s = 0;
                for (let c = 0; c < dc; c++) s += w(h * (dn + dv) + dn + j, c) * olat[h * dc + c];
                want.push(s);
              }
            }
            return { want: [want], atol: 1e-5 * Math.sqrt(dc), rtol: 1e-4 };
          },
        });
      }
    }
    // MQA: one key/value head shared by all query heads; keys and values are one array.
    const qq = r.f32(nh * (dc + dr), 1), lat = r.f32(npos * dc, 1), kr = r.f32(npos * dr, 1);
    const scale = 1 / Math.sqrt(dn + dr);
    cases.push({
      name: `mla_attend shared kv nh=${nh} dc=${dc} dr=${dr} npos=${npos}`,
      run: (k) => {
        const out = new Float32Array(nh * dc), sc = new Float32Array(nh * npos);
        k.k3_mla_attend(P(qq), P(lat), P(kr), P(lat), P(out), P(sc), npos, nh, 1, dc, dr, dc, scale, 0, nh);
        return [out, sc];
      },
      ref: () => {
        const out: number[] = [], probs: number[] = [];
        for (let h = 0; h < nh; h++) {
          const sc: number[] = [];
          for (let s = 0; s < npos; s++) {
            let a = 0;
            for (let i = 0; i < dc; i++) a += qq[h * (dc + dr) + i] * lat[s * dc + i];
            for (let i = 0; i < dr; i++) a += qq[h * (dc + dr) + dc + i] * kr[s * dr + i];
            sc.push(a * Math.fround(scale));
          }
          const m = Math.max(...sc);
          const e = sc.map((x) => Math.exp(x - m));
          const z = e.reduce((a, b) => a + b, 0);
          const p = e.map((x) => x / z);
          probs.push(...p);
          for (let j = 0; j < dc; j++) {
            let o = 0;
            for (let s = 0; s < npos; s++) o += p[s] * lat[s * dc + j];
            out.push(o);
          }
        }
        return { want: [out, probs], atol: 1e-4, rtol: 1e-4 };
      },
    });
  }
  return cases;
}

const allCases = () => [...matmulCases(1), ...mxfp4Cases(2), ...miscCases(3), ...attnCases(4), ...mlaLatentCases(5)];

function checkClose(
  got: ArrayLike<number>,
  want: ArrayLike<number>,
  atol: number,
  rtol: number,
  what: string,
) {
  assertEquals(got.length, want.length, `${what}: length`);
  let worst = 0, wi = -1;
  for (let i = 0; i < want.length; i++) {
    const err = Math.abs(got[i] - want[i]), tol = atol + rtol * Math.abs(want[i]);
    if (!(err <= tol) && !(Number.isNaN(got[i]) && Number.isNaN(want[i]))) {
      throw new Error(`${what}[${i}]: got ${got[i]}, want ${want[i]} (err ${err}, tol ${tol})`);
    }
    if (err / (tol || 1) > worst) (worst = err / (tol || 1)), (wi = i);
  }
  return { worst, wi };
}

// ------------------------------------------------------------------ (a) determinism

Deno.test("kernels: SIMD builds are bit-identical to scalar", () => {
  const { scalar, others, close } = loadLibs();
  try {
    assertEquals(isa(scalar), "scalar");
    assert(others.length > 0 || Deno.build.arch !== "x86_64", "no SIMD build to compare");
    const cases = allCases();
    for (const [name, k] of others) {
      if (name !== "native") assertEquals(isa(k), name, `libk3-${name} reports its ISA`);
      for (const c of cases) {
        const a = c.run(scalar), b = c.run(k);
        a.forEach((buf, i) => sameBytes(b[i], buf, `${name} (${isa(k)}) ${c.name} out ${i}`));
      }
    }
  } finally {
    close();
  }
});

Deno.test("kernels: batching tokens and splitting rows/heads never change a bit", () => {
  const { scalar, others, close } = loadLibs();
  try {
    const r = rng(9);
    for (const [name, k] of [["scalar", scalar] as [string, K], ...others]) {
      // 21: more tokens than one parked group of 16; 70: a prefill's many rows (several
      // groups, a partial one last), at the widths where column chunks matter
      for (const [cols, ntok] of [...COLS.map((c) => [c, 21]), [1000, 70], [7168, 70]]) {
        const rows = 11;
        for (const kind of ["f32", "bf16", "mxfp4"] as const) {
          const c = kind === "mxfp4" ? Math.max(32, cols - (cols % 32)) : cols;
          const w: ArrayBufferView = kind === "f32"
            ? r.f32(rows * c)
            : kind === "bf16"
            ? r.bf16(rows * c)
            : r.u8(rows * c / 2);
          const sc = r.scales(rows * c / 32);
          const x = r.f32(ntok * c);
          const mm = (xx: Float32Array, nt: number, r0: number, r1: number, y: Float32Array) =>
            kind === "mxfp4"
              ? k.k3_matmul_mxfp4(P(w), P(sc), P(xx), P(y), nt, rows, c, r0, r1)
              : k.k3_matmul(P(w), kind === "f32" ? 0 : 1, P(xx), P(y), nt, rows, c, r0, r1);
          const full = new Float32Array(ntok * rows);
          mm(x, ntok, 0, rows, full);
          // one token at a time
          for (let t = 0; t < ntok; t++) {
            const y1 = new Float32Array(rows);
            mm(x.subarray(t * c, (t + 1) * c), 1, 0, rows, y1);
            sameBytes(
              y1,
              full.subarray(t * rows, (t + 1) * rows),
              `${name} ${kind} cols=${c} tok ${t}`,
            );
          }
          // row splits
          for (const cuts of [[0, 1, rows], [0, 3, 7, rows], [0, 5, 6, 10, rows]]) {
            const y = new Float32Array(ntok * rows);
            for (let i = 0; i + 1 < cuts.length; i++) mm(x, ntok, cuts[i], cuts[i + 1], y);
            sameBytes(y, full, `${name} ${kind} cols=${c} split ${cuts}`);
          }
        }
      }
      // KDA and MLA: head ranges
      const nh = 4, d = 128;
      const S = r.f32(nh * d * d, 0.5),
        q = unitRows(r, nh, d),
        kk = unitRows(r, nh, d),
        v = r.f32(nh * d);
      const beta = r.f32(nh).map(sig), alpha = r.f32(nh * d).map((x) => Math.exp(-sig(x)));
      const kda = (ranges: number[][]) => {
        const s = S.slice(), o = new Float32Array(nh * d);
        for (const [h0, h1] of ranges) {
          k.k3_kda_step(P(s), P(q), P(kk), P(v), P(beta), P(alpha), P(o), d, h0, h1);
        }
        return [s, o];
      };
      const kf = kda([[0, nh]]), ks = kda([[0, 1], [1, 3], [3, 4]]);
      sameBytes(ks[0], kf[0], `${name} kda S split`);
      sameBytes(ks[1], kf[1], `${name} kda o split`);
      // KDA: three rows in one call, heads split, against a step a row.
      {
        const rows = 3, C = nh * d;
        const rq = new Float32Array(rows * C), rk = new Float32Array(rows * C), rv = r.f32(rows * C);
        for (let t = 0; t < rows; t++) rq.set(unitRows(r, nh, d), t * C), rk.set(unitRows(r, nh, d), t * C);
        const rb = r.f32(rows * nh).map(sig), ra = r.f32(rows * C).map((x) => Math.exp(-sig(x)));
        const one = S.slice(), oneO = new Float32Array(rows * C);
        for (let t = 0; t < rows; t++) {
          const at = (b: Float32Array, n = C) => P(b.subarray(t * n));
          k.k3_kda_step(P(one), at(rq), at(rk), at(rv), at(rb, nh), at(ra), at(oneO), d, 0, nh);
        }
        const all = S.slice(), allO = new Float32Array(rows * C);
        for (const [h0, h1] of [[0, 1], [1, 4]]) {
          k.k3_kda_steps(P(all), P(rq), P(rk), P(rv), P(rb), P(ra), P(allO), d, nh, rows, h0, h1);
        }
        sameBytes(all, one, `${name} kda steps S`);
        sameBytes(allO, oneO, `${name} kda steps o`);
      }
      const npos = 9, dn = 128, dr = 64, dv = 128;
      const mq = r.f32(nh * (dn + dr)),
        kn = r.f32(npos * nh * dn),
        kr = r.f32(npos * dr),
        mv = r.f32(npos * nh * dv);
      const mla = (ranges: number[][]) => {
        const out = new Float32Array(nh * dv), s = new Float32Array(nh * npos);
        for (const [h0, h1] of ranges) {
          k.k3_mla_attend(
            P(mq),
            P(kn),
            P(kr),
            P(mv),
            P(out),
            P(s),
            npos,
            nh,
            nh,
            dn,
            dr,
            dv,
            0.07,
            h0,
            h1,
          );
        }
        return out;
      };
      sameBytes(mla([[2, 4], [0, 2]]), mla([[0, nh]]), `${name} mla split`);
    }
  } finally {
    close();
  }
});

Deno.test("kernels: the many-token MXFP4 tiles give the scalar build's and each token's one-token bits", () => {
  const { scalar, others, close } = loadLibs();
  try {
    const r = rng(13);
    // 41 rows: more than one parked block of 32 rows, the last one partial; 288 columns: a
    // chunk of 8 groups and one of 1 (not a multiple of 256); scales with 255 (skipped) and 0
    const rows = 41, cols = 288;
    const packed = r.u8(rows * cols / 2), scales = r.scales(rows * cols / 32);
    scales[5] = 255; // row 0's final group, in the second chunk
    // tokens: one pair; 16 tiles (AVX-512) with 1, 15 and 0 left over; 8 tiles elsewhere;
    // several packed groups of 16 tokens with a token alone at the end
    const tokens = [2, 3, 8, 9, 15, 16, 17, 31, 33, 47];
    const x = r.f32(47 * cols);
    // whole rows, a range starting inside the first block, a range inside the second
    const ranges: [number, number][] = [[0, rows], [3, rows], [33, 40]];
    const run = (k: K, ntok: number, r0: number, r1: number) => {
      const y = new Float32Array(ntok * rows).fill(7), sums = new BigUint64Array(2);
      k.k3_matmul_mxfp4_checked(P(packed), P(scales), P(x), P(y), ntok, rows, cols, r0, r1, P(sums));
      return { y, sums };
    };
    const want = new Map<string, { y: Float32Array; sums: BigUint64Array }>();
    for (const ntok of tokens) for (const [r0, r1] of ranges) want.set(`${ntok} ${r0}`, run(scalar, ntok, r0, r1));
    for (const [name, k] of [["scalar", scalar] as [string, K], ...others]) {
      for (const ntok of tokens) {
        for (const [r0, r1] of ranges) {
          const what = `${name} ntok=${ntok} [${r0},${r1})`;
          const got = run(k, ntok, r0, r1), ref = want.get(`${ntok} ${r0}`)!;
          sameBytes(got.y, ref.y, `${what} against scalar`);
          // the checked product's sums: the matrix checks of its packed and scale rows
          const checks = new BigUint64Array(2);
          k.k3_matrix_check(P(packed.subarray(r0 * cols / 2)), cols / 2, r0, r1, P(checks));
          k.k3_matrix_check(P(scales.subarray(r0 * cols / 32)), cols / 32, r0, r1, P(checks.subarray(1)));
          assertEquals(got.sums[0], checks[0], `${what} packed rows' check`);
          assertEquals(got.sums[1], checks[1], `${what} scale rows' check`);
          // each token alone, through the one-token path
          const plain = new Float32Array(ntok * rows).fill(7);
          k.k3_matmul_mxfp4(P(packed), P(scales), P(x), P(plain), ntok, rows, cols, r0, r1);
          sameBytes(plain, got.y, `${what} unchecked`);
          for (const t of [0, ntok - 2, ntok - 1]) {
            const y1 = new Float32Array(rows).fill(7);
            k.k3_matmul_mxfp4(P(packed), P(scales), P(x.subarray(t * cols)), P(y1), 1, rows, cols, r0, r1);
            sameBytes(y1, got.y.subarray(t * rows, (t + 1) * rows), `${what} token ${t} alone`);
          }
        }
      }
    }
  } finally {
    close();
  }
});

Deno.test("kernels: MLA attention over a tile of query rows gives each row's bits alone", () => {
  const { scalar, others, close } = loadLibs();
  try {
    const r = rng(11);
    for (const [name, k] of [["scalar", scalar] as [string, K], ...others]) {
      // a partial block in every width (dn 20, dr 8, dv 20), per-head and shared keys/values;
      // the tiles' edges: npos 0, rows and heads not a multiple of a tile, positions across
      // the blocks of 64, a partial tile of columns (dv 40, 36)
      for (
        const [nh, kvh, dn, dr, dv, npos, nrows] of [
          [3, 3, 20, 8, 20, 1, 5],
          [4, 1, 32, 8, 32, 7, 6],
          [7, 1, 40, 8, 40, 0, 5],
          [6, 1, 20, 5, 36, 62, 7],
          [5, 1, 64, 64, 64, 127, 3],
        ]
      ) {
        const last = npos + nrows - 1, dq = dn + dr;
        const q = r.f32(nrows * nh * dq), kn = r.f32(last * kvh * dn), kr = r.f32(last * dr);
        const v = kvh === 1 && dv === dn ? kn : r.f32(last * kvh * dv);
        const out = new Float32Array(nrows * nh * dv), sc = new Float32Array(nrows * nh * last);
        // heads split in two calls, as the pool splits them
        for (const [h0, h1] of [[0, 1], [1, nh]]) {
          k.k3_mla_attend_rows(P(q), P(kn), P(kr), P(v), P(out), P(sc), npos, nrows, nh, kvh, dn, dr, dv, 0.3, h0, h1);
        }
        for (let j = 0; j < nrows; j++) {
          const n = npos + j, o1 = new Float32Array(nh * dv), s1 = new Float32Array(nh * n);
          k.k3_mla_attend(
            P(q.subarray(j * nh * dq)),
            P(kn),
            P(kr),
            P(v),
            P(o1),
            P(s1),
            n,
            nh,
            kvh,
            dn,
            dr,
            dv,
            0.3,
            0,
            nh,
          );
          sameBytes(out.subarray(j * nh * dv, (j + 1) * nh * dv), o1, `${name} row ${j} of ${nrows} out`);
          for (let h = 0; h < nh; h++) {
            const at = (j * nh + h) * last;
            sameBytes(sc.subarray(at, at + n), s1.subarray(h * n, (h + 1) * n), `${name} row ${j} head ${h} probs`);
          }
        }
        assert(out.some((x) => x !== 0), "the tile wrote its output");
      }
    }
  } finally {
    close();
  }
});

// ------------------------------------------------------------------ (b) accuracy

/** FNV-1a (32-bit) of the bytes of `views`, as 8 hex digits. */
function fnv1a(...views: ArrayBufferView[]): string {
  let h = 0x811c9dc5;
  for (const v of views) {
    for (const b of new Uint8Array(v.buffer, v.byteOffset, v.byteLength)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, "0");
}

Deno.test("kernels: MLA attention over a tile of rows gives the bits of the one-head kernel it replaced", () => {
  // Digests of the outputs and probabilities recorded from main's k3_mla_attend_rows at
  // 974587f (four scores of one head at a time, the output added position by position
  // into memory), the same on its scalar, AVX2, AVX-512 and native builds. The register
  // tiles only decide which lanes are computed together, so every build must still give them.
  // Re-recorded in 0.6.0, when the softmax's exp became k3's own instead of libm's expf:
  // the second and fifth changed (some probability's last bit), the others did not.
  const want = ["095b34f2", "3cd1e2ff", "2b1a58a8", "05cdd53e", "e664a018"];
  const { scalar, others, close } = loadLibs();
  try {
    for (const [name, k] of [["scalar", scalar] as [string, K], ...others]) {
      const r = rng(33), got: string[] = [];
      for (
        const [nh, kvh, dn, dr, dv, npos, nrows, h0, h1] of [
          ...MLA_EDGES,
          [96, 1, 512, 64, 512, 300, 3, 0, 96], // the released widths, keys and values one latent
        ]
      ) {
        const last = npos + nrows - 1, dq = dn + dr;
        const q = r.f32(nrows * nh * dq, 2), kn = r.f32(last * kvh * dn, 2), kr = r.f32(last * dr, 2);
        const v = kvh === 1 && dv === dn ? kn : r.f32(last * kvh * dv);
        const out = new Float32Array(nrows * nh * dv), sc = new Float32Array(nrows * nh * last + 1);
        k.k3_mla_attend_rows(P(q), P(kn), P(kr), P(v), P(out), P(sc), npos, nrows, nh, kvh, dn, dr, dv, 0.07, h0, h1);
        const probs: Float32Array[] = [];
        for (let j = 0; j < nrows; j++) {
          for (let h = h0; h < h1; h++) probs.push(sc.subarray((j * nh + h) * last, (j * nh + h) * last + npos + j));
        }
        got.push(fnv1a(out, ...probs));
      }
      assertEquals(got.join(" "), want.join(" "), `${name} (${isa(k)})`);
    }
  } finally {
    close();
  }
});

Deno.test("kernels: k3_peak_loop counts its multiplies and adds and leaves a finite sum", () => {
  const { scalar, others, close } = loadLibs();
  try {
    for (const [name, k] of [["scalar", scalar] as [string, K], ...others]) {
      const sink = new Float32Array(1).fill(NaN);
      assertEquals(Number(k.k3_peak_loop(0, P(sink))), 0, `${name}: no steps, no operations`);
      assertEquals(sink[0], 0, `${name}: no steps, a zero sum`);
      const flops = Number(k.k3_peak_loop(1000, P(sink)));
      // each step: some whole v16 chains (16 lanes, a multiply and an add each)
      assert(flops > 0 && flops % (1000 * 32) === 0, `${name}: ${flops} operations`);
      assert(Number.isFinite(sink[0]) && sink[0] > 0, `${name}: sum ${sink[0]}`);
    }
  } finally {
    close();
  }
});

Deno.test("kernels: k3_read_sum is the XOR of the bytes as little-endian 64-bit words", () => {
  const { scalar, others, close } = loadLibs();
  try {
    const r = rng(11);
    for (const n of [0, 7, 8, 63, 64, 1003, 4096 + 5]) {
      const b = r.u8(n + 8).subarray(3, 3 + n); // not 8-byte aligned
      const padded = new Uint8Array(Math.ceil(n / 8) * 8);
      padded.set(b);
      const dv = new DataView(padded.buffer);
      let want = 0n;
      for (let i = 0; i < padded.length; i += 8) want ^= dv.getBigUint64(i, true);
      for (const [name, k] of [["scalar", scalar] as [string, K], ...others]) {
        const got = BigInt(k.k3_read_sum(n ? P(b) : P(new Uint8Array(1)), BigInt(n)));
        if (got !== want) throw new Error(`${name} k3_read_sum(${n}): got ${got}, want ${want}`);
      }
    }
  } finally {
    close();
  }
});

Deno.test("kernels: scalar ops match an in-test float64 reference", () => {
  const { scalar, close } = loadLibs();
  try {
    for (const c of allCases()) {
      if (!c.ref) continue;
      const got = c.run(scalar);
      const { want, atol, rtol } = c.ref();
      want.forEach((w, i) => checkClose(got[i] as unknown as ArrayLike<number>, w, atol, rtol, c.name));
    }
  } finally {
    close();
  }
});

/** The spacing of float32 numbers at |x| (the subnormal spacing below the normals). */
function f32Ulp(x: number): number {
  const a = Math.abs(Math.fround(x));
  return a < 2 ** -126 ? 2 ** -149 : 2 ** (Math.floor(Math.log2(a)) - 23);
}

Deno.test("kernels: k3's own exp, tanh and sigmoid are within an ulp of float64 from 1e-38 to 1e4, at the edges and through NaN, on every build", () => {
  const { scalar, others, close } = loadLibs();
  try {
    // Every scale both signs, the exact zeros, the points where the range reduction's k
    // changes, the clamps of exp's argument, infinities and NaN.
    const mags = Array.from({ length: 43 }, (_, i) => 10 ** (i - 38)).concat([0.34657, 0.34658, 0.5, 1, 354, 355, 1e4]);
    const xs = Float32Array.from([0, -0, Infinity, -Infinity, NaN, ...mags, ...mags.map((m) => -m)]);
    const n = xs.length;
    const near = (got: number, want: number, what: string, x: number) => {
      if (Number.isNaN(want)) return assert(Number.isNaN(got), `${what}(${x}) is NaN, not ${got}`);
      assert(Math.abs(got - want) <= f32Ulp(want), `${what}(${x}) = ${got}, float64 says ${want}`);
    };
    for (const [name, k] of [["scalar", scalar] as [string, K], ...others]) {
      const s = new Float32Array(n);
      k.k3_sigmoid(P(xs), P(s), n);
      xs.forEach((x, i) => near(s[i], x === -Infinity ? 0 : sig(x), `${name} sigmoid`, x));
      // SiTU with u = 25 atanh(1/2): the linear branch is 12.5 whatever the gate.
      const u = new Float32Array(n).fill(25 * Math.atanh(0.5)), o = new Float32Array(n);
      k.k3_situ_glu(P(xs), P(u), P(o), n, 4, 25);
      xs.forEach((g, i) => {
        const want = g === Infinity
          ? 4 * 25 * Math.tanh(u[i] / 25)
          : 4 * Math.tanh(g / 4) * sig(g) * 25 * Math.tanh(u[i] / 25);
        near(o[i], g === -Infinity ? -0 : want, `${name} situ_glu gate`, g);
      });
      // ... and the gate held at 1 while u sweeps: tanh at every scale.
      const g1 = new Float32Array(n).fill(1);
      k.k3_situ_glu(P(g1), P(xs), P(o), n, 4, 25);
      xs.forEach((x, i) => near(o[i], 4 * Math.tanh(0.25) * sig(1) * 25 * Math.tanh(x / 25), `${name} situ_glu up`, x));
    }
  } finally {
    close();
  }
});

// ------------------------------------------------------------------ (b) the NumPy fixture

type Fx = {
  params: Record<string, number>;
  inputs: Record<string, number[]>;
  expected: Record<string, number[] | number>;
};

const f32a = (a: number[] | undefined) => (a ? Float32Array.from(a) : null);

/** Runs one fixture case; output buffers are zero-filled first (the fixture's convention). */
const FIXTURE_OPS: Record<
  string,
  { tol: [number, number]; run: (k: K, c: Fx) => Record<string, ArrayLike<number>> }
> = {
  // Sums of <= a few hundred products of O(1) values: f32 rounding is ~1e-6 absolute.
  matmul_f32: { tol: [1e-5, 1e-5], run: (k, c) => matmulFx(k, c, 0, f32a(c.inputs.w)!) },
  matmul_bf16: {
    tol: [1e-5, 1e-5],
    run: (k, c) => matmulFx(k, c, 1, Uint16Array.from(c.inputs.w_bits)),
  },
  matmul_mxfp4: {
    tol: [1e-5, 1e-5],
    run: (k, c) => {
      const { ntok, rows, cols, r0, r1 } = c.params;
      const y = new Float32Array(ntok * rows);
      const p = Uint8Array.from(c.inputs.packed), s = Uint8Array.from(c.inputs.scales);
      k.k3_matmul_mxfp4(P(p), P(s), P(f32a(c.inputs.x)), P(y), ntok, rows, cols, r0, r1);
      return { y };
    },
  },
  rmsnorm: {
    tol: [1e-6, 1e-5],
    run: (k, c) => {
      const { n, ngroups, eps } = c.params;
      const y = new Float32Array(n * ngroups);
      k.k3_rmsnorm(P(f32a(c.inputs.x)), P(f32a(c.inputs.w)), P(y), n, ngroups, eps);
      return { y };
    },
  },
  // |out| <= 100; k3's own exp and tanh are within an ulp.
  situ_glu: {
    tol: [1e-5, 1e-5],
    run: (k, c) => {
      const out = new Float32Array(c.params.n);
      k.k3_situ_glu(
        P(f32a(c.inputs.g)),
        P(f32a(c.inputs.u)),
        P(out),
        c.params.n,
        c.params.b1,
        c.params.b2,
      );
      return { out };
    },
  },
  short_conv: {
    tol: [1e-6, 1e-5],
    run: (k, c) => {
      const ch = c.params.channels, state = f32a(c.inputs.state)!, y = new Float32Array(ch);
      k.k3_short_conv(P(state), P(f32a(c.inputs.w)), P(f32a(c.inputs.x)), P(y), ch);
      return { y, state };
    },
  },
  l2norm: {
    tol: [1e-7, 1e-5],
    run: (k, c) => {
      const x = f32a(c.inputs.x)!;
      k.k3_l2norm(P(x), c.params.d, c.params.nheads, c.params.eps);
      return { x };
    },
  },
  kda_decay: {
    tol: [1e-7, 1e-5],
    run: (k, c) => {
      const { nheads, d, lb } = c.params, alpha = new Float32Array(nheads * d);
      k.k3_kda_decay(
        P(f32a(c.inputs.f)),
        P(f32a(c.inputs.a_log)),
        P(f32a(c.inputs.dt_bias)),
        P(alpha),
        nheads,
        d,
        lb,
      );
      return { alpha };
    },
  },
  // Two d-term column sums per output: error ~ d * 2^-24 * |S|.
  kda_step: {
    tol: [1e-5, 1e-5],
    run: (k, c) => {
      const { nheads, d, h0, h1 } = c.params,
        S = f32a(c.inputs.S)!,
        o = new Float32Array(nheads * d);
      const I = c.inputs;
      k.k3_kda_step(
        P(S),
        P(f32a(I.q)),
        P(f32a(I.k)),
        P(f32a(I.v)),
        P(f32a(I.beta)),
        P(f32a(I.alpha)),
        P(o),
        d,
        h0,
        h1,
      );
      return { S, o };
    },
  },
  // Softmax of f32 scores: relative error of exp(score) ~ |score| * 2^-24.
  mla_attend: {
    tol: [1e-5, 1e-4],
    run: (k, c) => {
      const { npos, nheads, dn, dr, dv, scale, h0, h1 } = c.params, I = c.inputs;
      const out = new Float32Array(nheads * dv), sc = new Float32Array(nheads * npos);
      k.k3_mla_attend(
        P(f32a(I.q)),
        P(f32a(I.knope)),
        P(f32a(I.krope)),
        P(f32a(I.v)),
        P(out),
        P(sc),
        npos,
        nheads,
        nheads,
        dn,
        dr,
        dv,
        scale,
        h0,
        h1,
      );
      return { out };
    },
  },
  router_topk: {
    tol: [1e-6, 1e-5],
    run: (k, c) => {
      const { nexperts, k: kk, scale } = c.params,
        ids = new Int32Array(kk),
        weights = new Float32Array(kk);
      const ret = k.k3_router_topk(
        P(f32a(c.inputs.logits)),
        P(f32a(c.inputs.bias)),
        nexperts,
        kk,
        scale,
        P(ids),
        P(weights),
      );
      return { ids, weights, ret: [ret] };
    },
  },
  attnres: {
    tol: [1e-5, 1e-4],
    run: (k, c) => {
      const { nsrc, n, eps } = c.params, out = new Float32Array(n);
      k.k3_attnres(
        P(f32a(c.inputs.src)),
        nsrc,
        n,
        P(f32a(c.inputs.norm_w)),
        P(f32a(c.inputs.proj_w)),
        eps,
        P(out),
      );
      return { out };
    },
  },
  sigmoid_mul: {
    tol: [1e-7, 1e-6],
    run: (k, c) => {
      const y = f32a(c.inputs.y)!;
      k.k3_sigmoid_mul(P(y), P(f32a(c.inputs.g)), c.params.n);
      return { y };
    },
  },
  argmax: {
    tol: [0, 0],
    run: (k, c) => ({ index: [k.k3_argmax(P(f32a(c.inputs.x)), c.params.n)] }),
  },
};

function matmulFx(
  k: K,
  c: Fx,
  wtype: number,
  w: ArrayBufferView,
): Record<string, ArrayLike<number>> {
  const { ntok, rows, cols, r0, r1 } = c.params;
  const y = new Float32Array(ntok * rows);
  k.k3_matmul(P(w), wtype, P(f32a(c.inputs.x)), P(y), ntok, rows, cols, r0, r1);
  return { y };
}

Deno.test("kernels: every op matches the NumPy float64 fixture tests/fixtures/ops.json", () => {
  let text: string;
  try {
    text = Deno.readTextFileSync(FIXTURE);
  } catch {
    throw new Error(`missing ${FIXTURE} (generate it with: deno task fixtures)`);
  }
  const fx = JSON.parse(text) as Record<string, Fx[]>;
  const { scalar, others, close } = loadLibs();
  try {
    for (const op of Object.keys(FIXTURE_OPS)) {
      assert(fx[op]?.length > 0, `fixture has no cases for ${op}`);
    }
    for (const op of Object.keys(fx)) {
      assert(op in FIXTURE_OPS, `fixture op ${op} has no runner here`);
    }
    for (const [name, k] of [["scalar", scalar] as [string, K], ...others]) {
      for (const [op, cases] of Object.entries(fx)) {
        const { tol, run } = FIXTURE_OPS[op];
        cases.forEach((c, i) => {
          const got = run(k, c);
          for (const [field, want] of Object.entries(c.expected)) {
            assert(field in got, `${op}[${i}]: kernel gives no "${field}"`);
            const w = typeof want === "number" ? [want] : want;
            const r = checkClose(got[field], w, tol[0], tol[1], `${name} ${op}[${i}].${field}`);
            if (Deno.env.get("K3_TEST_VERBOSE")) {
              console.log(name, op, i, field, r.worst.toFixed(3));
            }
          }
        });
      }
    }
  } finally {
    close();
  }
});
