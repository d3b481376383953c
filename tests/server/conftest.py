"""Harness for the end-to-end tests: start the real `serve` binary on the tiny checkpoint, wait for
/readyz, fail fast if it dies, and give every request a timeout so a hang fails instead of stalling.
"""
import http.client
import json
import os
import pathlib
import re
import signal
import subprocess
import threading
import time

import pytest

BIN_DIR = pathlib.Path(os.environ.get("DSUF_BIN_DIR", pathlib.Path(__file__).parents[2] / "build" / "bin"))
CKPT = os.environ.get("DSUF_TINY_CKPT", str(pathlib.Path(__file__).parents[2] / "build" / "test-tiny-ckpt"))
SOURCE_DIR = pathlib.Path(os.environ.get("DSUF_SOURCE_DIR", pathlib.Path(__file__).parents[2]))


class Server:
    """`host`: the address serve listens on and the tests dial; `wrap`: a command prefix (e.g.
    `ip netns exec NS`, which execs serve itself, so signals still reach it); `env`: its environment."""

    def __init__(self, *extra, ready=True, host="127.0.0.1", wrap=(), env=None):
        serve = BIN_DIR / "serve"
        assert serve.exists(), f"{serve} is missing: build the serve target"
        assert (pathlib.Path(CKPT) / "config.json").exists(), f"{CKPT}: no tiny checkpoint (CTest fixture tiny_ckpt)"
        self.host = host
        self.proc = subprocess.Popen(
            [*wrap, str(serve), "--ckpt", CKPT, "--host", host, "--port", "0", "--threads", "2", *extra],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        self.log = []
        self.port = None
        deadline = time.time() + 30
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError("serve exited before listening:\n" + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            assert time.time() < deadline, "serve did not start listening"
        threading.Thread(target=self._drain, daemon=True).start()
        if ready:
            self.wait_ready()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, "serve died:\n" + "".join(self.log)
            try:
                if self.request("GET", "/readyz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("serve never became ready:\n" + "".join(self.log))

    @property
    def base_url(self):
        return f"http://{self.host}:{self.port}"

    def request(self, method, path, body=None, headers=None, timeout=60):
        """Returns (status, headers dict, body bytes)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def chat(self, body, timeout=120):
        status, headers, data = self.request("POST", "/v1/chat/completions", body, timeout=timeout)
        return status, headers, json.loads(data) if data else None

    def metrics(self):
        status, _, data = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def metric(self, prefix):
        """Sum of every series whose name (with labels) starts with prefix."""
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    assert s.stop() == 0, "serve did not exit cleanly:\n" + "".join(s.log[-20:])


def sse_events(raw):
    """Splits an SSE body into the data payloads (JSON decoded; '[DONE]' kept as a string)."""
    out = []
    for block in raw.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                d = line[6:]
                out.append(d if d == "[DONE]" else json.loads(d))
    return out


@pytest.fixture(scope="session")
def tokenizer():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(SOURCE_DIR / "assets" / "tokenizer" / "tokenizer.json"))
