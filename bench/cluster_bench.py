"""Turn 2 on a replica that pulls the conversation's state from its owner, against a replica that
recomputes it, at several prompt lengths of the tiny model; and the state transfer's throughput
against `ucx_perftest -t ucp_get` (UCX over TCP on loopback) measured in the same run.

    make build && .venv/bin/python bench/cluster_bench.py [--lengths 512,1024,2048,3584]

    # 1K to 128K tokens: the tiny model with a 131072-token context
    build/bin/dsuf make-tiny --variant tiny-long --out build/tiny-long-ckpt --tokenizer-dir assets/tokenizer
    .venv/bin/python bench/cluster_bench.py --ckpt build/tiny-long-ckpt --max-context 131072 \
        --lengths 1024,4096,16384,65536,130000 [--recompute-up-to 16384]

With --recompute-up-to N, prompts longer than N are not recomputed on the reference replica (on
the CPU that is the longest part of the run): their "recompute" column is the owner's turn-1 TTFT,
a full prefill of the same prompt but the last turn's few tokens, marked with *, and the answers
are not compared. Needs redis-server (or $DSUF_REDIS_SERVER) and ucx-utils (ucx_perftest; without it the
last line says nan); prints a Markdown table. --serve-args "--gpus 0" runs every replica on the GPU."""
import argparse
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import http.client

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(os.environ.get("DSUF_BIN_DIR", ROOT / "build" / "bin"))
CKPT = os.environ.get("DSUF_TINY_CKPT", str(ROOT / "build" / "test-tiny-ckpt"))
MAX_CONTEXT = []  # serve flags for the context, set from --max-context
SERVE_ARGS = []  # extra serve flags for every replica, from --serve-args (e.g. "--gpus 0")
REDIS_SERVER = os.environ.get("DSUF_REDIS_SERVER", "redis-server")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class Serve:
    def __init__(self, name, *extra, env=None):
        self.port = free_port()
        e = dict(os.environ, **(env or {}))
        self.proc = subprocess.Popen([str(BIN / "serve"), "--ckpt", CKPT, "--host", "127.0.0.1", "--port",
                                      str(self.port), "--threads", "2", "--replica-id", name,
                                      "--prefill-chunk", "256", "--max-step-tokens", "256", *MAX_CONTEXT,
                                      *SERVE_ARGS, *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=e)
        deadline = time.time() + 180
        while time.time() < deadline:
            with contextlib.suppress(OSError):
                if self.get("/readyz")[0] == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{name} never became ready")

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()

    def metric(self, name):
        total = 0.0
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(name):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def chat(self, messages, max_tokens):
        """Streams; returns (content, usage, seconds to the first content-bearing chunk)."""
        body = json.dumps({"model": "deepseek-v4-flash", "messages": messages, "max_tokens": max_tokens,
                           "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                           "thinking": {"type": "disabled"}})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=7200)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200, r.read()
        ttft, text, usage = None, "", None
        buf = b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                line = ev.decode().strip()
                if not line.startswith("data: "):
                    continue  # SSE keep-alive comment
                d = line[6:]
                if d == "[DONE]":
                    continue
                j = json.loads(d)
                if j.get("usage"):
                    usage = j["usage"]
                for ch in j.get("choices", []):
                    if ch["delta"].get("content") is not None and ttft is None and ch["delta"].get("role") is None:
                        ttft = time.perf_counter() - t0
                    text += ch["delta"].get("content") or ""
        return text, usage, ttft if ttft is not None else time.perf_counter() - t0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def ucx_get_mbps(size):
    if not shutil.which("ucx_perftest"):
        return float("nan")
    env = dict(os.environ, UCX_TLS="tcp,self", UCX_NET_DEVICES="lo")
    port = free_port()
    srv = subprocess.Popen(["ucx_perftest", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=env)
    try:
        time.sleep(0.5)
        out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", "ucp_get", "-s", str(size), "-n",
                              "50"], capture_output=True, text=True, env=env, timeout=120).stdout
        m = re.search(r"Final:\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", out)
        return float(m.group(1)) if m else float("nan")
    finally:
        srv.kill()
        srv.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="512,1024,2048,3584")
    ap.add_argument("--ckpt", default=None, help="checkpoint (default: the test tiny checkpoint)")
    ap.add_argument("--max-context", type=int, default=0, help="serve --max-context (0: serve's default)")
    ap.add_argument("--recompute-up-to", type=int, default=1 << 30,
                    help="longer prompts use the owner's turn-1 TTFT as the recompute figure")
    ap.add_argument("--serve-args", default="", help='extra serve flags for every replica, e.g. "--gpus 0"')
    args = ap.parse_args()
    SERVE_ARGS[:] = args.serve_args.split()
    global CKPT
    if args.ckpt:
        CKPT = args.ckpt
    if args.max_context:
        MAX_CONTEXT[:] = ["--max-context", str(args.max_context)]
    rport = free_port()
    redis = subprocess.Popen([REDIS_SERVER, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(rport)
    env = {"DSUF_REDIS_URL": f"redis://127.0.0.1:{rport}", "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}
    a, b = Serve("A", env=env), Serve("B", env=env)
    ref = Serve("R", "--host-cache-gb", "0")
    rows = []
    try:
        for n in [int(x) for x in args.lengths.split(",")]:
            common = "the of and to in is it that was for on are with as his they be at one have this".split()
            words = " ".join(common[(i * 7) % len(common)] for i in range(n))  # one token per word
            t1 = [{"role": "user", "content": f"[{n}] {words}"}]
            reply, u1, ttft_turn1 = a.chat(t1, 4)
            t2 = t1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
            bytes0, secs0 = b.metric("dsuf:kv_transfer_bytes_total"), b.metric("dsuf:kv_transfer_seconds_total")
            got, u2, ttft_remote = b.chat(t2, 4)
            nbytes = b.metric("dsuf:kv_transfer_bytes_total") - bytes0
            secs = b.metric("dsuf:kv_transfer_seconds_total") - secs0
            proxy = n > args.recompute_up_to
            if proxy:
                ttft_recompute = ttft_turn1
            else:
                want, u3, ttft_recompute = ref.chat(t2, 4)
                assert got == want, (got, want)
            path = "ucx" if b.metric('dsuf:kv_transfer_path_total{path="ucx"') > len(rows) else "tcp"
            assert u2["prompt_tokens_details"]["cached_tokens"] > 0, u2
            print(f"{n}: prompt {u2['prompt_tokens']} cached {u2['prompt_tokens_details']['cached_tokens']} "
                  f"pull {secs:.4f}s {nbytes:.0f} B, ttft {ttft_remote:.3f} vs {ttft_recompute:.3f}"
                  f"{' (turn 1)' if proxy else ''}; turn 1 ttft on the owner {ttft_turn1:.3f}", file=sys.stderr,
                  flush=True)
            rows.append((u2["prompt_tokens"], u2["prompt_tokens_details"]["cached_tokens"], nbytes, secs,
                         ttft_remote, ttft_recompute, path, proxy))
        biggest = max(r[2] for r in rows)
        ucx = ucx_get_mbps(int(min(max(biggest, 65536), 64 << 20)))
    finally:
        for s in (a, b, ref):
            s.stop()
        redis.kill()
    print("| prompt tokens | cached | state bytes | path | pull s | pull MB/s | TTFT pull+prefill s | TTFT recompute s "
          "| speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p, c, nb, s, tr, tc, path, proxy in rows:
        mark = "*" if proxy else ""
        rate = f"{nb / s / 1e6:.0f}" if s > 0 else "-"
        print(f"| {p} | {c} | {int(nb)} | {path} | {s:.4f} | {rate} | {tr:.3f} | {tc:.3f}{mark} | {tc / tr:.0f}x |")
    print(f"\nucx_perftest -t ucp_get (UCX_TLS=tcp,self, lo), message {int(min(max(biggest, 65536), 64 << 20))} B: "
          f"{ucx:.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
