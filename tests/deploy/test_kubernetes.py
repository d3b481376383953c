"""deploy/kubernetes.yaml: valid against the bundled Kubernetes schema (strict: unknown fields are
errors), and shaped the way docs/cluster.md says: several replicas behind a plain Service, Redis,
probes on /readyz and /livez, a grace period above the drain, IPC_LOCK, resource requests, and only
flags that serve really has."""
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

SRC = pathlib.Path(os.environ.get("DSUF_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
BIN = pathlib.Path(os.environ.get("DSUF_BIN_DIR", SRC / "build" / "bin"))
MANIFEST = SRC / "deploy" / "kubernetes.yaml"


def validate(path):
    return subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version", "1.37.0",
                           str(path)], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def docs():
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def test_schema_strict():
    r = validate(MANIFEST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("passed") == 5, r.stdout


@pytest.mark.parametrize("edit", [
    lambda d: d["spec"].__setitem__("replicas", "three"),                        # wrong type
    lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("memlock", True),  # unknown field
])
def test_the_validator_rejects_a_broken_copy(tmp_path, edit):
    ds = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    edit(next(d for d in ds if d["kind"] == "Deployment" and d["metadata"]["name"] == "dsuf"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(ds))
    r = validate(bad)
    assert r.returncode != 0, r.stdout


def test_yamllint():
    r = subprocess.run([sys.executable, "-m", "yamllint", "-d", "{extends: relaxed, rules: {line-length: {max: 110}}}",
                        str(MANIFEST)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "error" not in r.stdout, r.stdout


def test_replicas_service_and_redis(docs):
    dep = docs[("Deployment", "dsuf")]
    svc = docs[("Service", "dsuf")]
    assert dep["spec"]["replicas"] >= 2
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"  # a plain Service: no affinity needed
    assert "sessionAffinity" not in svc["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    c = dep["spec"]["template"]["spec"]["containers"][0]
    port_names = {p["name"] for p in c["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names
    env = {e["name"]: e for e in c["env"]}
    m = re.fullmatch(r"redis://([\w-]+):(\d+)", env["DSUF_REDIS_URL"]["value"])
    assert m, env["DSUF_REDIS_URL"]
    rsvc = docs[("Service", m.group(1))]
    assert int(m.group(2)) in [p["port"] for p in rsvc["spec"]["ports"]]
    rdep = docs[("Deployment", "dsuf-redis")]
    assert rsvc["spec"]["selector"].items() <= rdep["spec"]["template"]["metadata"]["labels"].items()


def test_probes_shutdown_memlock_resources(docs):
    spec = docs[("Deployment", "dsuf")]["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    args = c["args"]
    drain = float(args[args.index("--drain-timeout") + 1])
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] > drain + pre_stop
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    req = c["resources"]["requests"]
    assert {"cpu", "memory", "nvidia.com/gpu"} <= req.keys()
    # The conversation store must fit in the memory request.
    gb = float(args[args.index("--host-cache-gb") + 1])
    assert req["memory"].endswith("Gi") and float(req["memory"][:-2]) > gb


def test_every_flag_is_one_serve_has(docs):
    serve = BIN / "serve"
    assert serve.exists(), f"{serve} is missing: build the serve target"
    usage = subprocess.run([str(serve), "--help"], capture_output=True, text=True, timeout=30).stdout
    known = set(re.findall(r"--[a-z][a-z-]+", usage))
    c = docs[("Deployment", "dsuf")]["spec"]["template"]["spec"]["containers"][0]
    flags = [a for a in c["args"] if a.startswith("--")]
    assert flags and set(flags) <= known, set(flags) - known
