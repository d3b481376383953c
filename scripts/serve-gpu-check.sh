#!/usr/bin/env bash
# Run on the GPU machine from the repo root with .gpu-libs/ (the shared libraries serve links, copied
# from the dev machine by scripts/gpu-check.sh --prepare), build/bin/serve and build-gpu/bin/dsuf
# carried; logs to $OUT. serve --gpus 0 and serve --cpu answer the same greedy request identically
# (GPU machine), and turn 2 of a conversation on the GPU server resumes from its host store
# (cached_tokens > 0) with the answer the CPU server gives by recomputing (--host-cache-gb 0).
# Exits 1 when an answer differs.
set -u
export LD_LIBRARY_PATH=$PWD/.gpu-libs:${LD_LIBRARY_PATH:-}
CK=/tmp/dsuf-tiny-ckpt-seed1
[ -f $CK/config.json ] || build-gpu/bin/dsuf make-tiny --out $CK --seed 1 --tokenizer-dir assets/tokenizer > /dev/null
build/bin/serve --ckpt $CK --gpus 0 --port 8100 > $OUT/serve_gpu.log 2>&1 &
G=$!
build/bin/serve --ckpt $CK --cpu --port 8101 --host-cache-gb 0 > $OUT/serve_cpu.log 2>&1 &
C=$!
for port in 8100 8101; do
  for i in $(seq 1 120); do
    python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$port/readyz').status==200 else 1)" 2>/dev/null && break
    sleep 0.5
  done
done
python3 - <<'PY' | tee $OUT/serve_compare.txt
import json, urllib.request, time, sys
def ask(port, stream, messages=None, thinking=True):
    body = {"model": "x", "messages": messages or [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 48, "temperature": 0, "stream": stream}
    if not thinking: body["thinking"] = {"type": "disabled"}
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
ok = True
for stream in (False, True):
    g = ask(8100, stream); c = ask(8101, stream)
    ok &= g[0] == c[0]
    print("stream" if stream else "plain ", "gpu==cpu:", g[0] == c[0], "| usage", g[1], "| gpu %.2fs cpu %.2fs" % (g[2], c[2]))
    print("  gpu text:", repr(g[0][:120]))
# Turn 2: the GPU server resumes from its host store, the CPU server recomputes.
t1 = [{"role": "user", "content": "Name three things that live in the sea, one per line."}]
reply = ask(8100, False, t1, thinking=False)[0]
t2 = t1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Now three that live on land."}]
for stream in (False, True):
    g = ask(8100, stream, t2, thinking=False); c = ask(8101, stream, t2, thinking=False)
    cached = (g[1] or {}).get("prompt_tokens_details", {}).get("cached_tokens", 0)
    ok &= g[0] == c[0] and cached > 0
    print("turn 2", "stream" if stream else "plain ", "gpu (cached %d) == cpu (recomputed):" % cached, g[0] == c[0],
          "| gpu %.2fs cpu %.2fs" % (g[2], c[2]))
print("serve: all answers equal, turn 2 cached" if ok else "serve: MISMATCH")
sys.exit(0 if ok else 1)
PY
rc=${PIPESTATUS[0]}
kill -TERM $G $C; wait
tail -3 $OUT/serve_gpu.log
exit $rc
