"""Minimal safetensors reader/writer (NumPy only), written from the file-format description.

Layout: 8-byte little-endian u64 header length N, then N bytes of JSON mapping
tensor name -> {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the
first byte after the header) plus an optional "__metadata__" object of strings, then the
raw little-endian tensor bytes.

Supported dtypes: BF16, F16, F32, U8. BF16 has no NumPy dtype, so it travels as uint16 bit
patterns; `f32_to_bf16_bits` rounds to nearest, ties to even, the way a correct converter
does (truncation would bias every weight toward zero).

The writer streams: the header is built from (name, dtype, shape) alone, then each
tensor's bytes are produced by a callback and written in order, so a checkpoint with
multi-gigabyte tensors never has more than one tensor (or one chunk of it) in memory.
"""

import json
import struct

import numpy as np

ELEM_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1}
_NP_STORAGE = {"BF16": "<u2", "F16": "<f2", "F32": "<f4", "U8": "u1"}


def f32_to_bf16_bits(a):
    """float array -> uint16 BF16 bit patterns, round-to-nearest-even; NaN stays NaN."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32)
    # For every non-NaN input the sum fits in 32 bits (largest is 0xFF7FFFFF + 0x8000).
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        # keep sign, force a quiet-NaN payload (rounding could otherwise carry into Inf)
        out[nan] = ((u[nan] >> np.uint32(16)).astype(np.uint16) | np.uint16(0x0040))
    return out


def bf16_bits_to_f32(b):
    """uint16 BF16 bit patterns -> float32 (exact widening)."""
    b = np.asarray(b, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def to_storage(arr, dtype):
    """Convert a float (or byte) array into the on-disk element representation of dtype."""
    if dtype == "BF16":
        return f32_to_bf16_bits(arr)
    if dtype == "F16":
        return np.ascontiguousarray(arr, dtype="<f2")
    if dtype == "F32":
        return np.ascontiguousarray(arr, dtype="<f4")
    if dtype == "U8":
        return np.ascontiguousarray(arr, dtype=np.uint8)
    raise ValueError(f"unsupported dtype {dtype}")


class StreamWriter:
    """Write one safetensors file whose tensors are declared up front.

    specs: list of (name, dtype, shape) in the order the bytes will be laid out.
    Then call write(name, array_or_chunk) repeatedly, in the same order; a tensor may be
    supplied in several row chunks (already in storage form or float; converted here).
    """

    def __init__(self, path, specs, metadata=None):
        self.path = path
        self.order = []
        header = {}
        off = 0
        for name, dtype, shape in specs:
            if dtype not in ELEM_SIZE:
                raise ValueError(f"unsupported dtype {dtype}")
            nbytes = numel(shape) * ELEM_SIZE[dtype]
            header[name] = {"dtype": dtype, "shape": [int(s) for s in shape],
                            "data_offsets": [off, off + nbytes]}
            self.order.append((name, dtype, nbytes))
            off += nbytes
        self.total_data = off
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        # JSON keys in name order (like the reference implementation); the byte layout is
        # given by the offsets, which follow `specs` order.
        hdr = json.dumps({k: header[k] for k in sorted(header)}, separators=(",", ":"))
        hb = hdr.encode("utf-8")
        hb += b" " * ((8 - len(hb) % 8) % 8)  # pad so data starts 8-aligned
        self.f = open(path, "wb")
        self.f.write(struct.pack("<Q", len(hb)))
        self.f.write(hb)
        self.idx = 0
        self.written = 0  # bytes written of the current tensor

    def write(self, name, data):
        tname, dtype, nbytes = self.order[self.idx]
        if name != tname:
            raise ValueError(f"expected tensor {tname}, got {name}")
        raw = to_storage(data, dtype).tobytes()
        self.f.write(raw)
        self.written += len(raw)
        if self.written > nbytes:
            raise ValueError(f"too many bytes for {name}")
        if self.written == nbytes:
            self.idx += 1
            self.written = 0

    def close(self):
        if self.idx != len(self.order):
            raise ValueError(f"file {self.path}: only {self.idx}/{len(self.order)} tensors written")
        self.f.close()


def save_file(path, tensors, dtypes=None, metadata=None):
    """Write a dict name -> array. dtypes: name -> BF16/F16/F32/U8 (default from array)."""
    dtypes = dtypes or {}
    specs = []
    for name, arr in tensors.items():
        dt = dtypes.get(name)
        if dt is None:
            dt = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
                  np.dtype(np.uint8): "U8"}.get(np.asarray(arr).dtype, "F32")
        specs.append((name, dt, np.asarray(arr).shape))
    w = StreamWriter(path, specs, metadata)
    for name, arr in tensors.items():
        w.write(name, np.asarray(arr))
    w.close()


def read_header(path):
    """Return (header dict without __metadata__, metadata or None, data start offset)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n).decode("utf-8"))
    meta = header.pop("__metadata__", None)
    return header, meta, 8 + n


def load_file(path, names=None, raw=False):
    """Read tensors. Float tensors are widened to float64 unless raw=True, in which case
    the storage array (uint16 bits for BF16) is returned. U8 stays uint8."""
    import os
    header, _meta, start = read_header(path)
    size = os.path.getsize(path)
    out = {}
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in header.items():
        if names is not None and name not in names:
            continue
        dt = info["dtype"]
        if dt not in ELEM_SIZE:
            raise ValueError(f"{path}: {name}: unsupported dtype {dt}")
        b, e = info["data_offsets"]
        if not (0 <= b <= e and start + e <= size):
            raise ValueError(f"{path}: {name}: bad offsets {b},{e}")
        shape = tuple(info["shape"])
        if e - b != numel(shape) * ELEM_SIZE[dt]:
            raise ValueError(f"{path}: {name}: size mismatch")
        buf = np.frombuffer(mm[start + b:start + e].tobytes(), dtype=_NP_STORAGE[dt])
        arr = buf.reshape(shape)
        if not raw:
            if dt == "BF16":
                arr = bf16_bits_to_f32(arr).astype(np.float64)
            elif dt in ("F16", "F32"):
                arr = arr.astype(np.float64)
        out[name] = arr
    del mm
    return out
