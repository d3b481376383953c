"""Checks our safetensors reader and writer against the Python safetensors package.

usage: safetensors_oracle.py ORACLE_BINARY

1. Python writes files (safetensors.numpy.save_file for the dtypes numpy has, serialize_file with raw
   buffers for BF16 and the FP8 dtypes) and `ORACLE dump` must report the same tensors, bytes and
   metadata, for a file and for a single-file checkpoint directory.
2. `ORACLE write` writes files and a sharded checkpoint; Python reads them back with
   safetensors.deserialize, safe_open and safetensors.numpy.load_file and checks every byte.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import safetensors
from safetensors import deserialize, safe_open, serialize_file
from safetensors.numpy import load_file, save_file

# numpy dtype -> safetensors spelling, for what save_file writes.
NUMPY_DTYPES = {
    np.float16: "F16", np.float32: "F32", np.float64: "F64",
    np.int8: "I8", np.uint8: "U8", np.int16: "I16", np.int32: "I32", np.int64: "I64",
    np.uint16: "U16", np.uint32: "U32", np.uint64: "U64", np.bool_: "BOOL",
}
# dtypes numpy lacks: safetensors spelling -> (name the Python binding takes, bytes per element)
RAW_DTYPES = {
    "BF16": ("bfloat16", 2), "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1), "F8_E8M0": ("float8_e8m0fnu", 1),
}
SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 0, 4), (2, 3, 11), (1, 1, 1, 1)]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def run_oracle(binary, *args):
    p = subprocess.run([binary, *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{binary} {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return json.loads(p.stdout)


def random_array(rng, dtype, shape):
    if dtype is np.bool_:
        a = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif np.issubdtype(dtype, np.floating):
        a = rng.standard_normal(size=shape).astype(dtype)
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if a.size and not a.any():
        a.flat[0] = 1  # never all zero
    return a


def write_raw(path, tensors, metadata):
    """tensors: name -> (safetensors dtype, shape, raw bytes)."""
    buffers = {n: np.frombuffer(b, dtype=np.uint8).copy() for n, (_, _, b) in tensors.items()}
    if hasattr(safetensors, "TensorSpec"):
        specs = {
            n: safetensors.TensorSpec(dtype=RAW_DTYPES[dt][0], shape=shape, data_ptr=buffers[n].ctypes.data,
                                      data_len=buffers[n].nbytes)
            for n, (dt, shape, _) in tensors.items()
        }
    else:  # safetensors < 0.8 took plain dicts
        specs = {n: {"dtype": RAW_DTYPES[dt][0], "shape": list(shape), "data": bytes(b)}
                 for n, (dt, shape, b) in tensors.items()}
    serialize_file(specs, path, metadata=metadata)


def python_writes(binary, tmp):
    rng = np.random.default_rng(1234)
    expected = {}  # name -> (dtype, shape, bytes)

    arrays = {}
    for dtype, st_name in NUMPY_DTYPES.items():
        for i, shape in enumerate(SHAPES):
            name = f"np.{st_name}.{i}"
            arrays[name] = random_array(rng, dtype, shape)
            expected[name] = (st_name, list(shape), arrays[name].tobytes())
    np_meta = {"format": "np", "note": "written by safetensors.numpy.save_file"}
    np_path = os.path.join(tmp, "py_numpy.safetensors")
    save_file(arrays, np_path, metadata=np_meta)

    raw = {}
    for st_name, (_, size) in RAW_DTYPES.items():
        for i, shape in enumerate(SHAPES):
            n = int(np.prod(shape, dtype=np.int64)) * size
            b = rng.integers(0, 256, size=n, dtype=np.uint8)
            if n and not b.any():
                b[0] = 1
            raw[f"raw.{st_name}.{i}"] = (st_name, list(shape), b.tobytes())
    # bf16 with known values too: 1.0, -2.0, 0.5 as raw uint16 views of the top half of float32.
    f32 = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    raw["raw.bf16.values"] = ("BF16", [3], (f32.view(np.uint32) >> 16).astype("<u2").tobytes())
    raw_meta = {"format": "raw"}
    raw_path = os.path.join(tmp, "py_raw.safetensors")
    write_raw(raw_path, raw, raw_meta)

    single_dir = os.path.join(tmp, "py_single")
    os.makedirs(single_dir)
    save_file(arrays, os.path.join(single_dir, "model.safetensors"), metadata=np_meta)

    for path, want, meta in [(np_path, expected, np_meta), (raw_path, raw, raw_meta),
                             (single_dir, expected, np_meta)]:
        got = run_oracle(binary, "dump", path)
        check(sorted(got["tensors"]) == sorted(want), f"{path}: tensor names differ")
        check(got["metadata"] == meta, f"{path}: metadata {got['metadata']} != {meta}")
        for name, (dt, shape, b) in want.items():
            g = got["tensors"].get(name)
            if g is None:
                continue
            check(g["dtype"] == dt, f"{path}: {name} dtype {g['dtype']} != {dt}")
            check(g["shape"] == shape, f"{path}: {name} shape {g['shape']} != {shape}")
            check(g["numel"] == int(np.prod(shape, dtype=np.int64)), f"{path}: {name} numel")
            check(g["hex"] == b.hex(), f"{path}: {name} bytes differ")
    print(f"python -> C++: {len(expected)} numpy tensors, {len(raw)} raw tensors, checked")


def pattern(n, k, dtype):
    j = np.arange(n, dtype=np.int64)
    v = ((j * 131 + k * 17 + 7 + (j >> 8)) & 0xFF).astype(np.uint8)
    return (v & 1 if dtype == "BOOL" else v).tobytes()


def element_size(dt):
    if dt in RAW_DTYPES:
        return RAW_DTYPES[dt][1]
    return next(np.dtype(t).itemsize for t, n in NUMPY_DTYPES.items() if n == dt)


def expected_bytes(m):
    n = int(np.prod(m["shape"], dtype=np.int64)) * element_size(m["dtype"])
    return pattern(n, m["k"], m["dtype"])


def check_layout(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    check((8 + n) % 8 == 0, f"{path}: data section starts at {8 + n}, not a multiple of 8")
    header = data[8:8 + n].decode("utf-8")
    stripped = header.rstrip(" ")
    check(stripped.endswith("}") and len(header) - len(stripped) < 8,
          f"{path}: header is not compact JSON padded with fewer than 8 spaces")
    return data


def cpp_writes(binary, tmp):
    out = os.path.join(tmp, "cpp")
    manifest = run_oracle(binary, "write", out)

    # Every dtype, through the reference parser (which validates the whole header and layout).
    path = os.path.join(out, "all.safetensors")
    got = dict(deserialize(check_layout(path)))
    check(sorted(got) == sorted(m["name"] for m in manifest["all"]), f"{path}: names differ")
    for m in manifest["all"]:
        g = got.get(m["name"])
        if g is None:
            continue
        check(g["dtype"] == m["dtype"], f"{path}: {m['name']} dtype {g['dtype']}")
        check(list(g["shape"]) == m["shape"], f"{path}: {m['name']} shape {g['shape']}")
        check(bytes(g["data"]) == expected_bytes(m), f"{path}: {m['name']} bytes differ")
    with safe_open(path, framework="numpy") as f:
        check(f.metadata() == {"writer": "dsuf", "unicode": "DeepSeek-V4.1 ｜ 模型"},
              f"{path}: metadata {f.metadata()}")
        for m in manifest["native"]:
            a = f.get_tensor(m["name"])
            check(list(a.shape) == m["shape"], f"{path}: numpy {m['name']} shape {a.shape}")
            check(a.tobytes() == expected_bytes(m), f"{path}: numpy {m['name']} bytes differ")

    # The numpy-only file through the high-level numpy API.
    path = os.path.join(out, "native.safetensors")
    check_layout(path)
    arrays = load_file(path)
    check(sorted(arrays) == sorted(m["name"] for m in manifest["native"]), f"{path}: names")
    for m in manifest["native"]:
        a = arrays[m["name"]]
        check(NUMPY_DTYPES[a.dtype.type] == m["dtype"], f"{path}: {m['name']} dtype {a.dtype}")
        check(a.tobytes() == expected_bytes(m), f"{path}: {m['name']} bytes differ")

    # The sharded checkpoint: index, shard names, and every tensor in the shard the index names.
    ck = os.path.join(out, "ckpt")
    with open(os.path.join(ck, "model.safetensors.index.json")) as f:
        index = json.load(f)
    total = sum(len(expected_bytes(m)) for m in manifest["ckpt"])
    check(index["metadata"]["total_size"] == total,
          f"index total_size {index['metadata']['total_size']} != {total}")
    wm = index["weight_map"]
    check(sorted(wm) == sorted(m["name"] for m in manifest["ckpt"]), "index weight_map names")
    shards = sorted(set(wm.values()))
    check(shards == [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)],
          f"shard names {shards}")
    seen = {}
    for shard in shards:
        for name, t in deserialize(check_layout(os.path.join(ck, shard))):
            check(wm.get(name) == shard, f"{shard} holds {name}, index says {wm.get(name)}")
            seen[name] = t
        with safe_open(os.path.join(ck, shard), framework="numpy") as f:
            check(f.metadata() == {"format": "pt"}, f"{shard}: metadata {f.metadata()}")
    for m in manifest["ckpt"]:
        t = seen.get(m["name"])
        check(t is not None and bytes(t["data"]) == expected_bytes(m),
              f"ckpt: {m['name']} missing or bytes differ")
    print(f"C++ -> python: {len(manifest['all'])} + {len(manifest['native'])} tensors, "
          f"{len(manifest['ckpt'])} in 3 shards, checked")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}")
    with tempfile.TemporaryDirectory(prefix="dsuf_st_oracle_") as tmp:
        python_writes(binary, tmp)
        cpp_writes(binary, tmp)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("OK")


if __name__ == "__main__":
    main()
