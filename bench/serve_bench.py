#!/usr/bin/env python3
"""Server overhead per streamed token, and concurrent streams held, for `serve` on the CPU backend.

    python3 bench/serve_bench.py --serve build/bin/serve --ckpt build/test-tiny-ckpt \
        [--streams 1,8,32] [--tokens 64] [--hold 1000]

Overhead. serve runs with --threads 1: the I/O thread (HTTP, JSON, detokenizing, parsing, SSE), the
preparation thread (parsing the body, rendering and tokenizing the prompt) and the scheduler
thread, which runs the backend's forward inline and measures that forward's CPU time
(dsuf:engine_forward_cpu_seconds_total). Per streamed token the bench reports the first two
threads' CPU time ("http") and the scheduler's CPU time outside the forward ("engine": sampling
over the 129,280 logits, batching, bookkeeping), read from /proc/<pid>/task/<tid>/schedstat in
nanoseconds, in the same run as the forward time.

Held. N streams are opened at once with a batch of 8, so all but 8 wait in the queue holding an
open SSE connection; the bench checks the server reports all N as running or waiting, records its
thread count and memory, then drops every connection and times how long the server takes to cancel
them all (each disconnect must cancel its request).
"""
import argparse
import asyncio
import http.client
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time



def start(serve, ckpt, *extra):
    def more_fds():
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    p = subprocess.Popen([serve, "--ckpt", ckpt, "--host", "127.0.0.1", "--port", "0", *extra],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=more_fds)
    port = None
    while port is None:
        line = p.stderr.readline()
        if not line:
            sys.exit("serve exited before listening")
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        port = int(m.group(1)) if m else None
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    while True:
        try:
            if get(port, "/readyz")[0] == 200:
                return p, port
        except OSError:
            pass
        time.sleep(0.05)


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read()


def metrics(port):
    out = {}
    for line in get(port, "/metrics")[1].decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[re.sub(r"\{.*\}", "", k)] = out.get(re.sub(r"\{.*\}", "", k), 0) + float(v)
    return out


def thread_cpu(pid):
    """CPU seconds per thread: (server side, scheduler side), from schedstat (nanoseconds;
    /proc/*/stat only has 10 ms ticks). The server side is the I/O thread (the main thread) and the
    request-preparation thread ("dsuf-prepare"); every other thread is the engine's."""
    server = engine = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                t = int(f.read().split()[0]) / 1e9
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except FileNotFoundError:
            continue
        if int(tid) == pid or name == "dsuf-prepare":
            server += t
        else:
            engine += t
    return server, engine


def proc_status(pid):
    s = {}
    for line in open(f"/proc/{pid}/status"):
        k, v = line.split(":", 1)
        s[k] = v.strip()
    return int(s["Threads"]), int(s["VmRSS"].split()[0]) / 1024


def body(max_tokens, i):
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": f"Tell me a story {i}"}],
                       "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0,
                       "thinking": {"type": "disabled"}}).encode()


def one_stream(port, max_tokens, i, gaps):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", body(max_tokens, i), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    last = None
    chunks = 0
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        now = time.perf_counter()
        if b'"content"' in line and b'"role"' not in line:
            if last is not None:
                gaps.append(now - last)
            last = now
            chunks += 1
    c.close()
    return chunks


def overhead(args):
    rows = []
    for s in args.streams:
        p, port = start(args.serve, args.ckpt, "--threads", "1", "--max-batch", "256", "--max-waiting", "100000")
        try:
            one_stream(port, 4, 0, [])  # warm the caches
            m0, c0, t0 = metrics(port), thread_cpu(p.pid), time.perf_counter()
            gaps = []
            threads = [threading.Thread(target=one_stream, args=(port, args.tokens, i, gaps)) for i in range(s)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            m1, c1 = metrics(port), thread_cpu(p.pid)
            tokens = m1["vllm:generation_tokens_total"] - m0["vllm:generation_tokens_total"]
            fwd = m1["dsuf:engine_forward_cpu_seconds_total"] - m0["dsuf:engine_forward_cpu_seconds_total"]
            # Server side: HTTP, JSON, rendering and tokenizing the prompt, detokenizing, parsing.
            # Engine side: the scheduler (forward, sampling, bookkeeping).
            io = c1[0] - c0[0]
            sched = c1[1] - c0[1]
            rows.append((s, tokens, wall, io + sched, fwd, io / tokens, (sched - fwd) / tokens,
                         statistics.median(gaps) if gaps else 0))
        finally:
            p.terminate()
            p.wait()
    print(f"{'streams':>7} {'tokens':>7} {'wall s':>7} {'cpu s':>7} {'fwd cpu s':>9} {'http/token':>11} "
          f"{'engine/token':>12} {'overhead':>8} {'median ITL':>10}")
    for s, tok, wall, cpu, fwd, io, eng, itl in rows:
        print(f"{s:>7} {tok:>7.0f} {wall:>7.2f} {cpu:>7.2f} {fwd:>9.2f} {io * 1e6:>8.0f} us {eng * 1e6:>9.0f} us "
              f"{(io + eng) * tok / cpu:>8.2%} {itl * 1e3:>7.1f} ms")


async def hold_stream(port, i, opened):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    b = body(1, i)
    w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(b)).encode() + b"\r\n\r\n" + b)
    await w.drain()
    head = await r.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:80]
    opened.append(w)


def hold(args):
    p, port = start(args.serve, args.ckpt, "--threads", "1", "--max-batch", "8", "--max-waiting", "100000")
    try:
        threads0, rss0 = proc_status(p.pid)

        async def run():
            opened = []
            t0 = time.perf_counter()
            sem = asyncio.Semaphore(200)  # the listen backlog, not the server, limits connect bursts

            async def guarded(i):
                async with sem:
                    await hold_stream(port, i, opened)
            await asyncio.gather(*(guarded(i) for i in range(args.hold)))
            t_open = time.perf_counter() - t0
            m = metrics(port)
            held = m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"]
            threads1, rss1 = proc_status(p.pid)
            t1 = time.perf_counter()
            for w in opened:
                w.close()
            while True:
                m = metrics(port)
                if m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"] == 0:
                    break
                await asyncio.sleep(0.01)
            t_cancel = time.perf_counter() - t1
            return t_open, held, threads1, rss1, t_cancel, m["dsuf:client_disconnects_total"]

        t_open, held, threads1, rss1, t_cancel, gone = asyncio.run(run())
        print(f"held: {args.hold} streams opened in {t_open:.2f} s; server reported {held:.0f} running+waiting "
              f"(a few finish while the rest open); threads {threads0} -> {threads1}; RSS {rss0:.0f} -> "
              f"{rss1:.0f} MiB ({(rss1 - rss0) * 1024 / args.hold:.1f} KiB per stream); all dropped and "
              f"cancelled in {t_cancel:.2f} s ({gone:.0f} disconnects counted)")
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", default="build/bin/serve")
    ap.add_argument("--ckpt", default="build/test-tiny-ckpt")
    ap.add_argument("--streams", default="1,8,32", type=lambda s: [int(x) for x in s.split(",") if x])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hold", type=int, default=1000)
    args = ap.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    overhead(args)
    if args.hold:
        hold(args)


if __name__ == "__main__":
    main()
