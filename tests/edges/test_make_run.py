"""``make run`` as a newcomer meets it: it serves HTTPS and the curl line it prints works as printed."""

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from tests.edges.serving import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_make_run_serves_and_its_printed_curl_line_shows_the_denial() -> None:
    port = free_port()
    run = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"PORT={port}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        assert run.stdout is not None
        printed = ""
        while "curl " not in printed:
            printed = run.stdout.readline()
            assert printed or run.poll() is None, "make run ended before printing the curl line"
        line = printed.strip()
        assert line.startswith("curl ") and f"https://127.0.0.1:{port}/validate" in line
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run(shlex.split(line), cwd=ROOT, capture_output=True, text=True, check=False)
            serving = done.returncode == 0 and "cache not ready" not in done.stdout
            if serving or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert done.returncode == 0, done.stderr
        assert '"allowed":false' in done.stdout
        assert 'queue \\"cr-queue1\\" has 1 NVIDIA-H200 left' in done.stdout
        assert (ROOT / "certs" / "ca.crt").exists()
    finally:
        os.killpg(run.pid, signal.SIGTERM)  # make and the server it started
        run.communicate(timeout=30)
