"""Shared by the scripts' CPU tests: run scripts/<name> on a temporary CSV holding `text`."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_on_csv(script, text, *args, check=False):
    """scripts/<script> CSV *args, the CSV a temporary file holding text (removed after); the
    finished process (stdout and stderr as text)."""
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), path, *args],
                              capture_output=True, text=True, check=check)
    finally:
        os.unlink(path)
