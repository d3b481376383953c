"""Differential test: `tokenize` of tools/dsuf_text.cc against HF `tokenizers` on the golden
vectors and a generated corpus (>= 5 MB by default), with and without added-token matching.

usage: hf_tokenizer_oracle.py CLI TOKENIZER_JSON [--mb N]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402


def run_cli(cli, tokenizer_path, texts, special):
    args = [cli, "tokenize", "--tokenizer", tokenizer_path] + (["--special"] if special else [])
    payload = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    t0 = time.perf_counter()
    p = subprocess.run(args, input=payload.encode(), capture_output=True, check=False)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{args} exited {p.returncode}: {p.stderr.decode()[:2000]}")
    lines = p.stdout.decode().split("\n")[:-1]
    if len(lines) != len(texts):
        sys.exit(f"expected {len(texts)} output lines, got {len(lines)}")
    return [json.loads(l)["ids"] for l in lines], dt


def first_difference(got, want, hf):
    n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    lo = max(0, n - 5)
    return (f"first differing id at {n}: ours {got[lo:n + 5]} vs HF {want[lo:n + 5]}; "
            f"HF tokens {[hf.id_to_token(i) for i in want[lo:n + 5]]}; "
            f"text near it {hf.decode(want[lo:n + 5])!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("tokenizer")
    ap.add_argument("--vectors", default=None)
    ap.add_argument("--mb", type=float, default=5.0)
    a = ap.parse_args()

    with_added = Tokenizer.from_file(a.tokenizer)
    spec = json.load(open(a.tokenizer, encoding="utf-8"))
    spec["added_tokens"] = []  # plain BPE: the same model with no added-token matching
    plain = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))

    texts = []
    if a.vectors:
        texts += [json.loads(l)["text"] for l in open(a.vectors, encoding="utf-8") if l.strip()]
    docs = corpus.documents(int(a.mb * 1e6))
    texts += docs + corpus.slices(docs, 20000)
    nbytes = sum(len(t.encode()) for t in texts)
    print(f"{len(texts)} texts, {nbytes / 1e6:.2f} MB")
    failures = 0
    for special, hf in ((True, with_added), (False, plain)):
        t0 = time.perf_counter()
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        t_hf = time.perf_counter() - t0
        got, t_ours = run_cli(a.cli, a.tokenizer, texts, special)
        bad = [i for i in range(len(texts)) if got[i] != want[i]]
        ntok = sum(len(w) for w in want)
        print(f"special={special}: {ntok} tokens, {len(bad)} mismatching texts "
              f"(HF batch {t_hf:.1f}s, ours incl. process+JSON {t_ours:.1f}s)")
        for i in bad[:5]:
            print(f"  text {i} ({len(texts[i])} chars): "
                  + first_difference(got[i], want[i], hf))
        failures += len(bad)
    if nbytes < a.mb * 1e6:
        sys.exit("corpus smaller than requested")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
