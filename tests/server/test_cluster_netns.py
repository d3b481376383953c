"""Two replicas in network namespaces of their own, joined by veth links, instead of two processes
on loopback: each replica has its own network stack and addresses, and the state crosses a link
between them (UCX over TCP on that link's device, as on a host without an RDMA NIC). Then the one
fault loopback cannot produce: the link between the replicas goes down in the middle of a pull,
so the puller hears nothing at all (no reset, no close) and must time out and recompute.

    root namespace: redis-server and this test (the client)
    root <-> A: 10.N.1.1 / 10.N.1.2    HTTP to A, A to Redis
    root <-> B: 10.N.2.1 / 10.N.2.2    HTTP to B, B to Redis
    A <-> B:    10.N.3.1 / 10.N.3.2    the state transfer

Needs root and `ip netns` (iproute2); skipped otherwise. Names carry the test's pid."""
import os
import shutil
import subprocess
import threading
import time

import pytest

from conftest import Server
from test_cluster import Redis, ask, turn1, turn2

PID = os.getpid()
N = 200 + PID % 50  # the 10.N.x.0/24 subnets


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class Net:
    def __init__(self):
        self.ns = {"A": f"dsuf{PID}A", "B": f"dsuf{PID}B"}
        self.http = {"A": f"10.{N}.1.2", "B": f"10.{N}.2.2"}
        self.root = {"A": f"10.{N}.1.1", "B": f"10.{N}.2.1"}
        self.xfer = {"A": f"10.{N}.3.1", "B": f"10.{N}.3.2"}
        self.link = {"A": f"d{PID}ab", "B": f"d{PID}ba"}  # the A-B link's end in each namespace
        try:
            for r in ("A", "B"):
                ip("netns", "add", self.ns[r])
                here, there = f"d{PID}r{r}", f"d{PID}{r}r"
                ip("link", "add", here, "type", "veth", "peer", "name", there)
                ip("link", "set", there, "netns", self.ns[r])
                ip("addr", "add", f"{self.root[r]}/24", "dev", here)
                ip("link", "set", here, "up")
                ip("-n", self.ns[r], "addr", "add", f"{self.http[r]}/24", "dev", there)
                ip("-n", self.ns[r], "link", "set", there, "up")
                ip("-n", self.ns[r], "link", "set", "lo", "up")
            ip("link", "add", self.link["A"], "type", "veth", "peer", "name", self.link["B"])
            for r in ("A", "B"):
                ip("link", "set", self.link[r], "netns", self.ns[r])
                ip("-n", self.ns[r], "addr", "add", f"{self.xfer[r]}/24", "dev", self.link[r])
                ip("-n", self.ns[r], "link", "set", self.link[r], "up")
        except subprocess.CalledProcessError as e:
            self.close()
            pytest.skip(f"network namespaces unavailable: {' '.join(e.cmd)}: {e.stderr.strip()}")

    def set_link(self, up):
        ip("-n", self.ns["A"], "link", "set", self.link["A"], "up" if up else "down")

    def close(self):
        # Deleting a namespace deletes the veth ends in it, and so their peers.
        for r in ("A", "B"):
            ip("netns", "del", self.ns[r], check=False)


@pytest.fixture(scope="module")
def net():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2")
    n = Net()
    yield n
    n.close()


@pytest.fixture(scope="module")
def redis(net):
    r = Redis(bind=[net.root["A"], net.root["B"]])
    yield r
    r.kill()


@pytest.fixture(scope="module")
def reference():
    s = Server("--host-cache-gb", "0")
    yield s
    assert s.stop() == 0


def replica(net, redis, name, fault=None):
    env = dict(os.environ, DSUF_REDIS_URL=f"redis://{net.root[name]}:{redis.port}", UCX_TLS="tcp,self",
               UCX_NET_DEVICES=net.link[name])
    if fault:
        env["DSUF_TRANSFER_FAULT"] = fault
    return Server("--replica-id", name, "--transfer-host", net.xfer[name], host=net.http[name],
                  wrap=("ip", "netns", "exec", net.ns[name]), env=env)


def test_turn2_pulls_the_state_across_the_link(net, redis, reference):
    reply_ref, _ = ask(reference, turn1("ns"))
    answer_ref, _ = ask(reference, turn2("ns", reply_ref))
    a, b = replica(net, redis, "A"), replica(net, redis, "B")
    try:
        reply, usage1 = ask(a, turn1("ns"))
        assert reply == reply_ref
        answer, usage2 = ask(b, turn2("ns", reply))
        assert answer == answer_ref
        assert usage2["prompt_tokens_details"]["cached_tokens"] >= usage1["prompt_tokens"], usage2
        assert b.metric('dsuf:conv_cache_lookups_total{tier="remote"}') == 1
        assert b.metric('dsuf:kv_transfer_path_total{path="ucx",reason="rdma_get"}') == 1, "".join(b.log[-5:])
        assert a.metric("dsuf:kv_transfer_served_total") == 1
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_a_link_cut_during_the_pull_times_out_and_recomputes(net, redis, reference):
    reply_ref, _ = ask(reference, turn1("cut"))
    answer_ref, _ = ask(reference, turn2("cut", reply_ref))
    a = replica(net, redis, "A", fault="hold")  # holds 2 s before answering a pull
    b = replica(net, redis, "B")
    try:
        reply, _ = ask(a, turn1("cut"))
        out = {}
        t = threading.Thread(target=lambda: out.update(r=ask(b, turn2("cut", reply))))
        t0 = time.time()
        t.start()
        time.sleep(0.5)  # B has sent its request; A is holding
        net.set_link(False)
        t.join(60)
        answer, usage = out["r"]
        assert answer == answer_ref
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert b.metric('dsuf:kv_transfer_failures_total{reason="timeout"}') == 1, "".join(b.log[-5:])
        assert time.time() - t0 < 30
        # Both stay up; once the link is back, the next conversation is pulled again.
        net.set_link(True)
        assert a.request("GET", "/readyz")[0] == 200 and b.request("GET", "/readyz")[0] == 200
        reply_ref, _ = ask(reference, turn1("back"))
        answer_ref, _ = ask(reference, turn2("back", reply_ref))
        reply, _ = ask(a, turn1("back"))
        answer, usage = ask(b, turn2("back", reply))
        assert answer == answer_ref
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0, "".join(b.log[-5:])
    finally:
        net.set_link(True)
        assert a.stop() == 0 and b.stop() == 0
