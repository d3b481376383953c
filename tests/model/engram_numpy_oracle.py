#!/usr/bin/env python3
"""Checks src/model/engram.{h,cc} against numpy (model-spec 3b.4).

Usage: engram_numpy_oracle.py <path to engram_oracle>

Builds one request, runs the C++ oracle on it, and compares every answer with what numpy (and the
official Engram rules, written out here independently in Python) gives: SeedSequence state, raw
PCG64 output, Generator.integers(dtype=int64) on both of numpy's bounded paths, the Engram
multipliers, the int64 hash with wrap-around and floor-mod, prime tables and row ids.
"""
import json
import math
import random
import subprocess
import sys

import numpy as np

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)


def is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    for d in range(3, math.isqrt(n) + 1, 2):
        if n % d == 0:
            return False
    return True


def prime_tables(layer_ids, max_ngram, vocab, n_heads):
    """Official rule: find_next_prime(start, seen) returns the smallest unseen prime > start;
    each n-gram size restarts at vocab - 1; primes are never reused, across layers too."""
    seen = set()
    tables = []
    for _ in layer_ids:
        primes = []
        for _n in range(2, max_ngram + 1):
            start = vocab - 1
            for _h in range(n_heads):
                c = start + 1
                while not (is_prime(c) and c not in seen):
                    c += 1
                seen.add(c)
                primes.append(c)
                start = c
        offsets = [0]
        for p in primes[:-1]:
            offsets.append(offsets[-1] + p)
        tables.append((primes, offsets, sum(primes)))
    return tables


def official_multipliers(layer, max_ngram, vocab):
    m_max = I64_MAX // vocab
    half_bound = max(1, m_max // 2)
    r = np.random.default_rng(10007 * layer).integers(0, half_bound, size=(max_ngram,),
                                                       dtype=np.int64)
    return [int(x) for x in (r * 2 + 1)]


def numpy_hashes(mult, ids):
    """ids: [N, max_ngram] int64 (already padded). Returns [N, max_ngram - 1] int64, numpy
    semantics (wrap-around multiply, xor)."""
    x = np.asarray(ids, dtype=np.int64)
    m = np.asarray(mult, dtype=np.int64)
    mix = x[:, 0] * m[0]
    out = []
    for i in range(1, len(mult)):
        mix = np.bitwise_xor(mix, x[:, i] * m[i])
        out.append(mix.copy())
    return np.stack(out, axis=1)


class Checker:
    def __init__(self):
        self.counts = {}
        self.failures = []

    def eq(self, what, got, want, detail=""):
        self.counts[what] = self.counts.get(what, 0) + 1
        if got != want and len(self.failures) < 20:
            self.failures.append(f"{what} {detail}: C++ {got!r} != numpy {want!r}")


def main():
    oracle = sys.argv[1]
    rnd = random.Random(20261129)
    np.seterr(over="ignore")

    seeds = [0, 1, 2, 3, 10007, 10007 * 14, 2**32 - 1, 2**32, 2**32 + 1, 2**64 - 1]
    seeds += [10007 * layer for layer in range(61)]
    seeds += [rnd.randrange(0, 2**32) for _ in range(60)]
    seeds += [rnd.randrange(2**32, 2**64) for _ in range(60)]

    # Ranges [low, high): every bounded path of numpy's random_bounded_uint64_fill.
    ranges = [
        (0, 1), (5, 6),                       # rng == 0: no draw
        (0, 2), (0, 7), (0, 1000), (-5, 5),   # 32-bit Lemire
        (0, 2**31 + 1), (0, 2**31 + 2),       # 32-bit, ~50 % rejection
        (0, 2**32 - 1),                       # largest 32-bit Lemire range
        (0, 2**32), (-(2**31), 2**31),        # rng == 0xFFFFFFFF: plain next_uint32
        (0, 2**32 + 1), (0, 2**40), (0, 46539438283891),  # 64-bit Lemire (the last: V=99092)
        (I64_MIN, 1), (I64_MIN, 2),           # 64-bit, ~50 % rejection
        (I64_MIN, I64_MAX), (0, I64_MAX),     # widest ranges endpoint=False allows
    ]
    integer_cases = []
    for s in seeds:
        calls = []
        for _ in range(rnd.randrange(1, 7)):  # mixed calls on one generator: the 32-bit buffer
            lo, hi = rnd.choice(ranges)       # carries over between calls
            calls.append([lo, hi, rnd.randrange(0, 9)])
        integer_cases.append({"seed": s, "calls": calls})
    for lo, hi in ranges:
        integer_cases.append({"seed": rnd.randrange(0, 2**64), "calls": [[lo, hi, 257]]})

    vocabs = [1, 2, 3, 1000, 99092, 129280 * 5, 2**31 - 1, 2**31, 2**31 + 1, 3 * 10**9, 2**32,
              2**33 + 17, 2**40, 2**62 - 1, 2**62, 2**62 + 1, I64_MAX]
    mult_cases = [{"layer": layer, "max_ngram": n, "vocab": v}
                  for v in vocabs for layer in (0, 1, 2, 14, 39, 40) for n in (2, 4, 5)]
    mult_cases += [{"layer": rnd.randrange(0, 200), "max_ngram": rnd.randrange(1, 9),
                    "vocab": rnd.randrange(1, I64_MAX)} for _ in range(200)]

    # Raw hash semantics: arbitrary int64 ids and multipliers (wrap-around, negative h).
    hash_cases = []
    for _ in range(20):
        n = rnd.randrange(2, 6)
        mult = [rnd.randrange(I64_MIN, I64_MAX) for _ in range(n)]
        ids = [[rnd.choice([rnd.randrange(I64_MIN, I64_MAX), rnd.randrange(-5, 100000)])
                for _ in range(n)] for _ in range(50)]
        mods = [1009, 16000057, 2**31 - 1, 2**62 + 135, -7, -1033, 2, 3]
        hash_cases.append({"multipliers": mult, "ids": ids, "mods": mods})

    # Hasher configs: (layer_ids, max_ngram, vocab, n_heads, compressed_vocab).
    configs = [
        ([1], 4, 1000, 2, 99092),             # model-spec 6.2 tiny
        ([1, 14], 4, 16000000, 8, 99092),     # the real V4.1-Flash config
    ]
    for _ in range(12):
        layers = sorted(rnd.sample(range(0, 61), rnd.randrange(1, 4)))
        configs.append((layers, rnd.randrange(2, 6), rnd.choice([1, 2, 3, rnd.randrange(1, 100000)]),
                        rnd.randrange(1, 5),
                        rnd.choice([1, 2, 99092, 2**31 - 1, rnd.randrange(1, 2**31)])))
    hasher_cases = []
    expected = []
    for layers, max_ngram, vocab, n_heads, cv in configs:
        tables = prime_tables(layers, max_ngram, vocab, n_heads)
        pad = rnd.randrange(0, cv)
        contexts = []
        for _ in range(400):
            ctx = [rnd.choice([rnd.randrange(0, cv), cv - 1, 0, pad]) for _ in range(max_ngram)]
            if rnd.random() < 0.4:
                ctx[rnd.randrange(0, max_ngram)] = -1  # crosses the start or a DEAD token
            contexts.append(ctx)
        cfg = {"layer_ids": layers, "num_embeddings": [t[2] for t in tables],
               "max_ngram": max_ngram, "vocab": vocab, "n_heads": n_heads, "compressed_vocab": cv}
        hasher_cases.append({"config": cfg, "pad_cid": pad, "contexts": contexts})
        expected.append((tables, layers, max_ngram, n_heads, cv, pad, contexts))
    # A wrong table size must be rejected, naming the field.
    bad = dict(hasher_cases[0]["config"], num_embeddings=[6127])
    hasher_cases.append({"config": bad, "pad_cid": 2, "contexts": []})

    request = {
        "seed_state": [{"seed": s, "n": 8} for s in seeds],
        "raw": [{"seed": s, "n": 16} for s in seeds],
        "integers": integer_cases,
        "multipliers": mult_cases,
        "hashes": hash_cases,
        "hasher": hasher_cases,
    }
    proc = subprocess.run([oracle], input=json.dumps(request), capture_output=True, text=True,
                          check=True)
    got = json.loads(proc.stdout)
    ck = Checker()

    for s, g in zip(seeds, got["seed_state"]):
        ck.eq("SeedSequence.generate_state", g,
              [int(x) for x in np.random.SeedSequence(s).generate_state(8, np.uint32)], f"seed {s}")
    for s, g in zip(seeds, got["raw"]):
        want = np.random.default_rng(s).bit_generator.random_raw(16)
        ck.eq("PCG64.random_raw", g, [int(x) for x in want], f"seed {s}")
    for case, g in zip(integer_cases, got["integers"]):
        gen = np.random.default_rng(case["seed"])
        for (lo, hi, n), gv in zip(case["calls"], g):
            want = [int(x) for x in gen.integers(lo, hi, size=n, dtype=np.int64)]
            ck.eq("Generator.integers", gv, want, f"seed {case['seed']} [{lo}, {hi}) n={n}")
    for case, g in zip(mult_cases, got["multipliers"]):
        ck.eq("engram multipliers", g,
              official_multipliers(case["layer"], case["max_ngram"], case["vocab"]), str(case))
    for case, g in zip(hash_cases, got["hashes"]):
        h = numpy_hashes(case["multipliers"], case["ids"])
        mods = np.asarray(case["mods"], dtype=np.int64)
        for row, gh, gm in zip(h, g["hashes"], g["mods"]):
            ck.eq("int64 hash", gh, [int(x) for x in row])
            ck.eq("floor-mod", gm, [int(x) for x in (row[:, None] % mods[None, :]).reshape(-1)])

    negative_h = 0
    for (tables, layers, max_ngram, n_heads, cv, pad, contexts), g in zip(expected,
                                                                          got["hasher"]):
        name = f"config layers={layers} ngram={max_ngram} heads={n_heads} cv={cv}"
        if "error" in g:
            ck.eq("hasher constructed", g["error"], None, name)
            continue
        for slot, (primes, offsets, _rows) in enumerate(tables):
            ck.eq("primes", g["primes"][slot], primes, name)
            ck.eq("offsets", g["offsets"][slot], offsets, name)
            mult = official_multipliers(layers[slot], max_ngram, cv)
            ck.eq("hasher multipliers", g["multipliers"][slot], mult, name)
            padded = []
            for ctx in contexts:
                out, dead = [], False
                for c in ctx:
                    dead = dead or c < 0
                    out.append(pad if dead else c)
                padded.append(out)
            h = numpy_hashes(mult, padded)  # [N, max_ngram - 1]
            negative_h += int((h < 0).sum())
            p = np.asarray(primes, dtype=np.int64).reshape(max_ngram - 1, n_heads)
            o = np.asarray(offsets, dtype=np.int64).reshape(max_ngram - 1, n_heads)
            rows = (h[:, :, None] % p[None] + o[None]).reshape(len(contexts), -1)
            for ctx, want, gr in zip(contexts, rows, g["rows"][slot]):
                ck.eq("row ids", gr, [int(x) for x in want], f"{name} ctx {ctx}")
    err = got["hasher"][-1].get("error", "")
    ck.eq("bad engram_num_embeddings rejected", "engram_num_embeddings[0]" in err, True, err)

    for what, n in ck.counts.items():
        print(f"{what}: {n} cases")
    print(f"negative hashes among valid-id row contexts: {negative_h}")
    if ck.failures:
        print("MISMATCHES:\n  " + "\n  ".join(ck.failures))
        return 1
    print("all match numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
