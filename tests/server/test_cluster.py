"""Replicas sharing conversation caches through a real redis-server: turn 1 on A, turn 2 on B pulls
A's state (cached_tokens > 0) and answers exactly what a server without any cache answers; then the
fault cases of spec ecosystem.md §3.1, each ending in that same correct answer."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import Server

MODEL = "deepseek-v4-flash"
USER1 = "Tell me about the history of the printing press in Europe, in some detail please."
USER2 = "And what happened next in Asia?"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, bind=("127.0.0.1",)):
        self.bind = list(bind)
        self.port = free_port()
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            # Bound to test addresses only; off loopback (network namespaces) protected mode would
            # refuse the replicas.
            ["redis-server", "--port", str(self.port), "--bind", *self.bind, "--protected-mode",
             "yes" if self.bind == ["127.0.0.1"] else "no", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((self.bind[0], self.port), timeout=0.2):
                return
            time.sleep(0.02)
        raise AssertionError("redis-server did not start")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def url(self):
        return f"redis://{self.bind[0]}:{self.port}"


@pytest.fixture(scope="module")
def redis():
    r = Redis()
    yield r
    r.kill()


def replica(redis, name, *extra, env=None):
    """A serve replica on the shared Redis (env: extra environment, e.g. a transfer fault)."""
    old = dict(os.environ)
    os.environ["DSUF_REDIS_URL"] = redis.url
    # UCX over TCP on loopback: no RDMA NIC here; the same GET runs as RDMA on InfiniBand/RoCE.
    os.environ["UCX_TLS"] = "tcp,self"
    os.environ["UCX_NET_DEVICES"] = "lo"
    os.environ.update(env or {})
    try:
        return Server("--replica-id", name, *extra)
    finally:
        os.environ.clear()
        os.environ.update(old)


def kill9(s):
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait()


def body(messages, max_tokens=8):
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "thinking": {"type": "disabled"}}


def turn1(tag):
    return [{"role": "user", "content": f"[{tag}] {USER1}"}]


def turn2(tag, reply):
    return turn1(tag) + [{"role": "assistant", "content": reply}, {"role": "user", "content": USER2}]


def ask(server, messages, max_tokens=8, headers=None):
    h = {"Content-Type": "application/json", **(headers or {})}
    status, _, data = server.request("POST", "/v1/chat/completions", json.dumps(body(messages, max_tokens)), headers=h,
                                     timeout=120)
    assert status == 200, data
    r = json.loads(data)
    return r["choices"][0]["message"]["content"], r["usage"]


@pytest.fixture(scope="module")
def reference():
    """A server with no conversation cache at all: the answers every replica must give."""
    s = Server("--host-cache-gb", "0")
    yield s
    assert s.stop() == 0


def expected(reference, tag):
    reply, _ = ask(reference, turn1(tag))
    answer, usage = ask(reference, turn2(tag, reply))
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    return reply, answer


def metric(s, name):
    return s.metric(name)


def test_turn2_on_another_replica_pulls_the_state_and_answers_identically(redis, reference):
    reply_ref, answer_ref = expected(reference, "basic")
    a, b = replica(redis, "A"), replica(redis, "B")
    try:
        reply, usage1 = ask(a, turn1("basic"))
        assert reply == reply_ref
        assert usage1["prompt_tokens_details"]["cached_tokens"] == 0
        answer, usage2 = ask(b, turn2("basic", reply))
        assert answer == answer_ref
        cached = usage2["prompt_tokens_details"]["cached_tokens"]
        assert cached >= usage1["prompt_tokens"], usage2  # at least turn 1's whole prompt
        assert cached < usage2["prompt_tokens"]
        assert usage2["prompt_cache_hit_tokens"] == cached
        assert metric(b, 'dsuf:conv_cache_lookups_total{tier="remote"}') == 1
        assert metric(b, "dsuf:kv_transfer_bytes_total") > 0
        # The bytes moved by UCX RMA GET, not the TCP fallback (both would give the same answer).
        assert metric(b, 'dsuf:kv_transfer_path_total{path="ucx",reason="rdma_get"}') == 1
        assert metric(a, "dsuf:kv_transfer_served_total") == 1
        # A third turn back on B is a local hit.
        _, usage3 = ask(b, turn2("basic", reply) + [{"role": "assistant", "content": answer},
                                                   {"role": "user", "content": "Thanks."}])
        assert usage3["prompt_tokens_details"]["cached_tokens"] > cached
        assert metric(b, 'dsuf:conv_cache_lookups_total{tier="local"}') == 1
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_session_header_and_a_rewritten_history(redis, reference):
    a, b = replica(redis, "A"), replica(redis, "B")
    try:
        h = {"x-deepseek-harness-session-id": "sess-42"}
        reply, _ = ask(a, turn1("sess"), headers=h)
        # The client rewrote its first message: nothing of A's state agrees with the new prompt.
        edited = [{"role": "user", "content": "[sess] Something else entirely."},
                  {"role": "assistant", "content": reply}, {"role": "user", "content": USER2}]
        answer, usage = ask(b, edited, headers=h)
        ref_answer, _ = ask(reference, edited)
        assert answer == ref_answer
        # BOS and the user tag still agree, but less than a hash block: nothing is reused.
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_owner_killed_before_the_transfer(redis, reference):
    reply_ref, answer_ref = expected(reference, "dead")
    a, b = replica(redis, "A"), replica(redis, "B")
    try:
        reply, _ = ask(a, turn1("dead"))
        kill9(a)
        answer, usage = ask(b, turn2("dead", reply))
        assert answer == answer_ref
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(b, 'dsuf:kv_transfer_failures_total{reason="connect"}') == 1
        assert metric(b, "dsuf:conv_ownership_stale_cleared_total") >= 1
    finally:
        b.stop()


def test_owner_killed_during_the_transfer(redis, reference):
    reply_ref, answer_ref = expected(reference, "mid")
    a = replica(redis, "A", env={"DSUF_TRANSFER_FAULT": "stall"})  # sends half, then stalls
    b = replica(redis, "B")
    try:
        reply, _ = ask(a, turn1("mid"))
        out = {}
        t = threading.Thread(target=lambda: out.update(r=ask(b, turn2("mid", reply))))
        t.start()
        time.sleep(0.5)  # B is connected and A has sent half the state, then stalls
        kill9(a)
        t.join(60)
        answer, usage = out["r"]
        assert answer == answer_ref
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        # Killed mid-send: the connection resets under the puller.
        assert metric(b, 'dsuf:kv_transfer_failures_total{reason="closed"}') == 1, "".join(b.log[-5:])
        assert metric(b, "dsuf:kv_transfer_total") == 0
    finally:
        b.stop()


def test_stale_record_after_the_owner_restarted(redis, reference):
    reply_ref, answer_ref = expected(reference, "stale")
    port = str(free_port())
    a = replica(redis, "A", "--transfer-port", port)
    b = replica(redis, "B")
    try:
        reply, _ = ask(a, turn1("stale"))
        kill9(a)
        a = replica(redis, "A", "--transfer-port", port)  # same address, new incarnation, empty store
        answer, usage = ask(b, turn2("stale", reply))
        assert answer == answer_ref
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(b, 'dsuf:kv_transfer_failures_total{reason="incarnation"}') == 1
        assert metric(b, "dsuf:conv_ownership_stale_cleared_total") >= 1
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_redis_killed_and_restarted_mid_run(redis, reference):
    reply_ref, answer_ref = expected(reference, "redis")
    a, b = replica(redis, "A"), replica(redis, "B")
    try:
        redis.kill()
        reply, _ = ask(a, turn1("redis"))  # served locally; the claim waits for Redis
        assert reply == reply_ref
        assert a.request("GET", "/readyz")[0] == 200
        assert metric(a, "dsuf:redis_up") == 0
        redis.start()
        deadline = time.time() + 20
        while metric(a, "dsuf:conv_ownership_claims_total") < 1 and time.time() < deadline:
            time.sleep(0.2)
        assert metric(a, "dsuf:conv_ownership_claims_total") >= 1, "A never re-published after Redis came back"
        answer, usage = ask(b, turn2("redis", reply))
        assert answer == answer_ref
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0
        assert metric(a, "dsuf:redis_errors_total") >= 1
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_two_replicas_race_for_one_conversation(redis, reference):
    reply_ref, answer_ref = expected(reference, "race")
    a, b, c = replica(redis, "A"), replica(redis, "B"), replica(redis, "C")
    try:
        outs = [None, None]
        ts = [threading.Thread(target=lambda i=i, s=s: outs.__setitem__(i, ask(s, turn1("race"))))
              for i, s in enumerate((a, b))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert outs[0][0] == outs[1][0] == reply_ref
        time.sleep(0.5)  # the claims run just after the answers
        assert metric(a, "dsuf:conv_ownership_cas_conflicts_total") + \
            metric(b, "dsuf:conv_ownership_cas_conflicts_total") >= 1
        answer, usage = ask(c, turn2("race", reply_ref))
        assert answer == answer_ref
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    finally:
        assert a.stop() == 0 and b.stop() == 0 and c.stop() == 0


def test_a_hot_owner_over_its_cap_sends_the_puller_to_recompute(redis, reference):
    reply_ref, answer_ref = expected(reference, "hot")
    a = replica(redis, "A", "--max-outbound-transfers", "0")
    b = replica(redis, "B")
    try:
        reply, _ = ask(a, turn1("hot"))
        answer, usage = ask(b, turn2("hot", reply))
        assert answer == answer_ref
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(b, 'dsuf:kv_transfer_failures_total{reason="busy"}') == 1
        assert metric(a, 'dsuf:kv_transfer_refused_total{reason="busy"}') == 1
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_version_skew_is_refused_and_recomputed(redis, reference):
    reply_ref, answer_ref = expected(reference, "skew")
    a = replica(redis, "A")
    b = replica(redis, "B", "--served-model-name", "other-revision")
    try:
        reply, _ = ask(a, turn1("skew"))
        req = body(turn2("skew", reply))
        req["model"] = "other-revision"
        status, _, data = b.request("POST", "/v1/chat/completions", json.dumps(req))
        assert status == 200
        r = json.loads(data)
        assert r["choices"][0]["message"]["content"] == answer_ref
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(b, 'dsuf:kv_transfer_failures_total{reason="version_skew"}') == 1
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_corrupted_transfer_is_discarded(redis, reference):
    reply_ref, answer_ref = expected(reference, "corrupt")
    a = replica(redis, "A", env={"DSUF_TRANSFER_FAULT": "corrupt"})
    b = replica(redis, "B")
    try:
        reply, _ = ask(a, turn1("corrupt"))
        answer, usage = ask(b, turn2("corrupt", reply))
        assert answer == answer_ref
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(b, 'dsuf:kv_transfer_failures_total{reason="checksum"}') == 1
    finally:
        assert a.stop() == 0 and b.stop() == 0
