"""The processes a server spawns die with it, however it dies: a server killed with SIGKILL (the
OOM killer, ``kill -9``, a node lost) leaves neither its reclaim solver nor its selectors' evaluator
nor multiprocessing's resource tracker behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A server stand-in: spawns a worker the way the serving replica does, prints its children, waits.
SOLVER = """
import asyncio
from webhook.cluster.reclaimer import InProcess

async def main():
    solve = InProcess()
    await solve([])  # the first pass spawns the solver's process
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""
EVALUATOR = """
import multiprocessing, time
from concurrent.futures import ProcessPoolExecutor
from webhook.cluster import selectors

pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=selectors._child)
pool.submit(int, "1").result()  # the first job spawns the evaluator's process, as the Evaluator's
print("ready", flush=True)
time.sleep(3600)
"""


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("script", [SOLVER, EVALUATOR], ids=["reclaim solver", "selectors' evaluator"])
def test_a_killed_servers_workers_and_resource_tracker_die_with_it(script: str) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        spawned = children(server.pid)
        assert len(spawned) >= 2, "a worker and the resource tracker"  # the worker, the tracker
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in spawned) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in spawned if alive(pid)]
        assert not left, f"left running after their server was killed: {left}"
    finally:
        server.kill()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()
