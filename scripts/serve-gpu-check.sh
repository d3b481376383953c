#!/usr/bin/env bash
# Run on the GPU machine from the repo root with .gpu-libs/ (the ICU and PCRE2 shared libraries serve
# links, copied from the dev machine), build/bin/serve and build-gpu/bin/dsuf carried; logs to $OUT.
# serve --gpus 0 and serve --cpu answer the same greedy request identically (GPU machine).
set -u
export LD_LIBRARY_PATH=$PWD/.gpu-libs:${LD_LIBRARY_PATH:-}
CK=/tmp/dsuf-tiny-ckpt-seed1
[ -f $CK/config.json ] || build-gpu/bin/dsuf make-tiny --out $CK --seed 1 --tokenizer-dir assets/tokenizer > /dev/null
build/bin/serve --ckpt $CK --gpus 0 --port 8100 > $OUT/serve_gpu.log 2>&1 &
G=$!
build/bin/serve --ckpt $CK --cpu --port 8101 > $OUT/serve_cpu.log 2>&1 &
C=$!
for port in 8100 8101; do
  for i in $(seq 1 120); do
    python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$port/readyz').status==200 else 1)" 2>/dev/null && break
    sleep 0.5
  done
done
python3 - <<'PY' | tee $OUT/serve_compare.txt
import json, urllib.request, time
def ask(port, stream):
    body = {"model": "x", "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 48, "temperature": 0, "stream": stream}
    if stream: body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req) as r:
        data = r.read().decode()
    dt = time.time() - t0
    if not stream:
        j = json.loads(data)
        return j["choices"][0]["message"].get("content"), j["usage"], dt
    text, usage = "", None
    for line in data.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            j = json.loads(line[6:])
            if j.get("usage"): usage = j["usage"]
            for c in j.get("choices", []):
                text += (c.get("delta", {}).get("content") or "") + (c.get("delta", {}).get("reasoning_content") or "")
    return text, usage, dt
for stream in (False, True):
    g = ask(8100, stream); c = ask(8101, stream)
    print("stream" if stream else "plain ", "gpu==cpu:", g[0] == c[0], "| usage", g[1], "| gpu %.2fs cpu %.2fs" % (g[2], c[2]))
    print("  gpu text:", repr(g[0][:120]))
PY
kill -TERM $G $C; wait
tail -3 $OUT/serve_gpu.log
