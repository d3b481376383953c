"""The plain-urllib seed client streams a completion with usage and prints the decode speed."""
import pathlib
import re
import subprocess
import sys


def test_seed_client_runs_unchanged(server):
    script = pathlib.Path(__file__).with_name("seed_client.py")
    out = subprocess.run([sys.executable, str(script), "--url", server.base_url, "--max-tokens", "16"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"prompt (\d+) tokens, completion (\d+) tokens; first token after [\d.]+ s; decode ([\d.]+) tok/s",
                     last)
    assert m, last
    assert int(m.group(2)) >= 1 and int(m.group(1)) > 0
    if int(m.group(2)) > 1:
        assert float(m.group(3)) > 0
