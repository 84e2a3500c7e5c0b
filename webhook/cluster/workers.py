"""The processes the server spawns (the reclaim solver, the selectors' evaluator) die with it,
however it dies: stopped, killed, or its container gone.

A spawned worker is not told when its server is killed: it would wait on its pipe for ever, holding
the model's memory and keeping multiprocessing's resource tracker alive beside it. So each worker
asks the kernel to kill it when the thread that spawned it ends (Linux's ``PR_SET_PDEATHSIG``: at
once, even on a node too busy to run the worker), and also looks every second whether its parent
is still there (every other system, and a thread that spawned it and ended while the server lives,
which the kernel counts as its parent's death: the worker goes, and is spawned again at its next
job).
"""

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

PARENT_SECONDS = 1.0  # how often a worker looks whether the server that spawned it is still there
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a worker, first: gone as soon as the process that spawned it is."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it went before the kernel was asked
        os._exit(0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="parent watch", daemon=True).start()
