"""SIGTERM: /readyz turns 503 at once, new chats get 503, in-flight streams finish within the drain
window or end with an error event and [DONE]; then the process exits 0. Startup errors exit 1 with
a message that names the problem."""
import json
import signal
import subprocess
import threading
import time
import urllib.request

from conftest import BIN_DIR, CKPT, Server, sse_events


def start_stream(port, max_tokens, box):
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "thinking": {"type": "disabled"}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode())

    def run():
        with urllib.request.urlopen(req, timeout=120) as r:
            box["events"] = sse_events(r.read())
    t = threading.Thread(target=run)
    t.start()
    return t


def wait_running(s):
    deadline = time.time() + 30
    while s.metric("vllm:num_requests_running") < 1:
        assert time.time() < deadline
        time.sleep(0.02)


def test_sigterm_ends_long_streams_with_error_and_done():
    s = Server("--drain-timeout", "1.5")
    box = {}
    t = start_stream(s.port, 3000, box)
    wait_running(s)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    status, _, data = s.request("GET", "/readyz")
    assert status == 503 and json.loads(data)["status"] == "draining"
    status, headers, data = s.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert status == 503 and headers.get("retry-after") == "5"
    assert "shutting down" in json.loads(data)["error"]["message"]
    t.join(30)
    ev = box["events"]
    assert ev[-1] == "[DONE]"
    assert "shutting down" in ev[-2]["error"]["message"]
    assert s.proc.wait(30) == 0
    assert time.time() - t0 < 10


def test_sigterm_lets_short_streams_finish():
    s = Server("--drain-timeout", "30")
    box = {}
    t = start_stream(s.port, 25, box)
    wait_running(s)
    s.proc.send_signal(signal.SIGTERM)
    t.join(60)
    ev = box["events"]
    assert ev[-1] == "[DONE]"
    assert ev[-2]["choices"][0]["finish_reason"] == "length"
    assert s.proc.wait(30) == 0


def run_serve(*args):
    return subprocess.run([str(BIN_DIR / "serve"), *args], capture_output=True, text=True, timeout=60)


def test_startup_errors_name_the_problem():
    r = run_serve("--ckpt", "/nonexistent/ckpt", "--port", "0")
    assert r.returncode == 1 and "no checkpoint at /nonexistent/ckpt" in r.stderr
    r = run_serve("--port", "99999")
    assert r.returncode == 1 and "--port" in r.stderr
    r = run_serve("--bogus")
    assert r.returncode == 1 and "unknown argument --bogus" in r.stderr
    r = run_serve("--gpus", "x")
    assert r.returncode == 1 and "--gpus" in r.stderr and "'x'" in r.stderr, r.stderr
    # No CUDA in this build, or one GPU at most for now: either way a clear refusal.
    r = run_serve("--gpus", "0,1", "--ckpt", CKPT, "--port", "0")
    assert r.returncode == 1 and "--gpus" in r.stderr, r.stderr
