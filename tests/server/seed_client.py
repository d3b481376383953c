#!/usr/bin/env python3
"""Streams one chat completion with plain urllib and prints the decode speed.

    seed_client.py [--url http://127.0.0.1:8000] [--prompt TEXT] [--max-tokens N]

No third-party packages: this is what a user with nothing but Python runs against `serve`.
"""
import argparse
import json
import sys
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--prompt", default="Write a haiku about the sea.")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": args.prompt}],
        "max_tokens": args.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(args.url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    first = None
    usage = None
    with urllib.request.urlopen(req) as resp:
        for raw in resp:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                piece = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
                if piece:
                    if first is None:
                        first = time.time()
                    sys.stdout.write(piece)
                    sys.stdout.flush()
    end = time.time()
    print()
    if usage is None:
        print("no usage received", file=sys.stderr)
        return 1
    n = usage["completion_tokens"]
    decode_s = end - (first or end)
    speed = (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0
    print(f"prompt {usage['prompt_tokens']} tokens, completion {n} tokens; "
          f"first token after {(first or end) - t0:.3f} s; decode {speed:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
