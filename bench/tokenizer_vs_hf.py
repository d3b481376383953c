"""Tokenizer speed against HF `tokenizers` on the same texts in the same run.

usage: tokenizer_vs_hf.py BENCH_BINARY [--tokenizer FILE] [--mb N]

Generates an English+code set and a CJK set of ~4 KB documents (tests/text/corpus.py, fixed
seeds), times bench/tokenizer_bench and HF `Tokenizer.encode` (both single-threaded, one text at
a time, RAYON_NUM_THREADS=1, thread CPU time) on each, and prints MB/s and the ratio twice: for the first pass of a freshly loaded
tokenizer (empty word caches) and for the best later pass (warm caches). Both sides use plain
BPE (no added-token matching), the path user text takes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "text"))
import corpus  # noqa: E402

os.environ.setdefault("RAYON_NUM_THREADS", "1")
from tokenizers import Tokenizer  # noqa: E402


def make_set(gens, total, seed):
    import random
    r = random.Random(seed)
    docs, size = [], 0
    while size < total:
        parts, n = [], 0
        while n < 4096:  # ~4 KB documents, like a chat message or a file chunk
            s = r.choice(gens)(r)
            parts.append(s)
            n += len(s.encode())
        docs.append("".join(parts))
        size += len(docs[-1].encode())
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "assets/tokenizer/tokenizer.json"))
    ap.add_argument("--mb", type=float, default=4.0)
    a = ap.parse_args()
    spec = json.load(open(a.tokenizer, encoding="utf-8"))
    spec["added_tokens"] = []
    spec_text = json.dumps(spec, ensure_ascii=False)
    sets = {
        "english+code": make_set([corpus.english, corpus.english, corpus.code], a.mb * 1e6, 1),
        "cjk": make_set([corpus.chinese, corpus.chinese, corpus.japanese], a.mb * 1e6, 2),
    }
    for name, docs in sets.items():
        nbytes = sum(len(d.encode()) for d in docs)
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
            path = f.name
        out = subprocess.run([a.bench, a.tokenizer, path, "5"], capture_output=True, check=True)
        ours = json.loads(out.stdout)
        os.unlink(path)
        hf = Tokenizer.from_str(spec_text)  # fresh: its word cache starts empty, as ours does
        times = []
        for _ in range(4):
            t0 = time.thread_time()  # CPU time: the machine is shared
            ntok = sum(len(hf.encode(d, add_special_tokens=False).ids) for d in docs)
            times.append(time.thread_time() - t0)
        if ntok != ours["tokens"]:
            sys.exit(f"{name}: token counts differ (ours {ours['tokens']}, HF {ntok})")
        hf_cold, hf_warm = nbytes / times[0] / 1e6, nbytes / min(times[1:]) / 1e6
        print(f"{name:13s} {nbytes / 1e6:4.1f} MB {ntok:8d} tokens | first pass: ours "
              f"{ours['cold_mb_per_s']:6.1f} MB/s, HF {hf_cold:5.1f} MB/s, ratio "
              f"{ours['cold_mb_per_s'] / hf_cold:5.1f}x | best repeat: ours {ours['mb_per_s']:6.1f} "
              f"MB/s, HF {hf_warm:5.1f} MB/s, ratio {ours['mb_per_s'] / hf_warm:5.1f}x")

if __name__ == "__main__":
    main()
