"""DRA selectors worked out off the loop that answers reviews and renews the Lease (SPEC §4b).

A serving replica's state evaluates at most a turn's budget of selectors on the loop
(``Devices.budget``); what a reading needs beyond it is deferred, and :class:`Evaluator` works it
out in a process of its own: it takes the jobs the state leaves (``Devices.take``, each reading in
turn, so a costly one does not starve the others), sends each to the process, and gives the answers
back to the state (``ClusterState.selectors_evaluated``), which charges again the pods charged
meanwhile. A review that deferred a reading waits for it (``settled``) under a bound, and is then
decided again.

The process is spawned at the first job (it shares nothing with the server but the jobs it is
sent, and never the interpreter's lock, and imports only the model), runs only on a processor
nothing else wants (``SCHED_IDLE``), and exits when the server is gone, however it went; one that
died is spawned again at the next job, the jobs it held deferred anew.
"""

import asyncio
import contextlib
import logging
import multiprocessing
import os
import pickle
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the process that evaluates imports this module: the model only, not the state
    from webhook.core.index.state import ClusterState
from webhook.cluster import workers
from webhook.core.model.claims import INLINE_UNITS, Done, Job, Selectors, evaluate_selectors

log = logging.getLogger(__name__)
JOB_UNITS = 2_000_000  # cost units one job carries (about 0.1 s of evaluation)
IDLE_SECONDS = 0.05  # how often the state is looked at while no job waits
DEADLINE = 30.0  # seconds one job may take in its process: later, it is stuck and stopped
ABANDON_SECONDS = 10.0  # a deferred reading nobody asked for in this long is dropped
RECHARGE_SECONDS = 5.0  # how often pods charged while their readings were deferred ask again


class Evaluator:
    """Works out, in a process of its own, what ``state`` deferred; and sets ``state``'s budget."""

    def __init__(self, state: "ClusterState", budget: int = INLINE_UNITS) -> None:
        self.state = state
        state.inventory.devices.budget = budget
        self._pool: ProcessPoolExecutor | None = None
        self._wake = asyncio.Event()
        self._done = asyncio.Event()  # set, and replaced, each time a job's answers are kept
        self.jobs = 0  # jobs worked out so far
        self.seconds = 0.0  # and the time they took, in their process and back
        self.dropped = 0  # deferred readings dropped, nobody asking for them any more
        self._asked: dict[Selectors, tuple[int, float]] = {}  # asks seen, and when they last grew
        self._recharged = time.monotonic()

    def _abandon(self) -> None:
        """Drop the deferred readings nobody asked for in ``ABANDON_SECONDS`` (a template deleted, a
        controller that gave up: its work would be for no one), and have the pods charged while theirs
        were deferred ask again every ``RECHARGE_SECONDS`` (they still need theirs)."""
        devices, now = self.state.inventory.devices, time.monotonic()
        if self.state.pending and now - self._recharged > RECHARGE_SECONDS:
            self._recharged = now
            self.state.recharge_pending()
        asks = devices.asks()
        for selectors, count in asks.items():
            seen = self._asked.get(selectors)
            if seen is None or seen[0] != count:
                self._asked[selectors] = (count, now)
            elif now - seen[1] > ABANDON_SECONDS:
                devices.drop(selectors)
                del self._asked[selectors]
                self.dropped += 1
        for gone in self._asked.keys() - asks.keys():
            del self._asked[gone]

    async def run(self) -> None:
        devices = self.state.inventory.devices
        try:
            while True:
                self._abandon()
                job = devices.take(JOB_UNITS)
                if job is None:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), IDLE_SECONDS)
                    continue
                started = time.perf_counter()
                try:
                    done = await self._work(job)
                except (BrokenProcessPool, TimeoutError, OSError) as exc:
                    devices.give_back(job)
                    log.warning("a selector evaluation off the loop failed", extra={"error": repr(exc)})
                    await asyncio.sleep(1.0)
                    continue
                self.state.selectors_evaluated(job, done)
                self._done.set()
                self._done = asyncio.Event()
                self.jobs += 1
                self.seconds += time.perf_counter() - started
                await asyncio.sleep(0)  # each job's answers are one turn: the loop's other work between
        finally:
            self.close()

    async def _work(self, job: Job) -> Done:
        if not job.devices and not any(job.sketch):
            return [None] * len(job.selectors), [None] * len(job.selectors), []  # all known already
        spawned = self._pool is None
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_child
            )
        packed = pickle.dumps(job)
        working = asyncio.get_running_loop().run_in_executor(self._pool, _work_packed, packed)
        if spawned:  # it is started by the first job: made background work at once, before it imports
            for process in list((getattr(self._pool, "_processes", None) or {}).values()):
                background(process.pid)
        try:
            return await asyncio.wait_for(working, DEADLINE)
        except TimeoutError:  # a job is bounded (its cost): one this late is stuck
            self.close()
            raise
        except BrokenProcessPool:
            self._pool = None
            raise

    async def settled(self, readings: set[Selectors], timeout: float) -> None:
        """Until no work of ``readings`` waits or is being worked out, or ``timeout`` seconds."""
        devices = self.state.inventory.devices
        deadline = time.monotonic() + timeout
        while any(devices.busy(s) for s in readings) and (left := deadline - time.monotonic()) > 0:
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), left)

    def close(self) -> None:
        """Stop the process now, whatever it is working out (one left running would outlive this
        process's exit)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list((getattr(pool, "_processes", None) or {}).values()):  # none public before 3.14
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def background(pid: int | None = None) -> None:
    """Process ``pid`` (None: this one) runs only on a processor nothing else wants (Linux's
    ``SCHED_IDLE``), or else at the lowest priority: the server's loop, and anything else, goes
    first."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(pid or 0, os.SCHED_IDLE, os.sched_param(0))
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid or 0, 19)


def _child() -> None:
    """In the process, first: background work, and gone as soon as the server is (killed, it
    closes nothing: the process would outlive it, holding the model's memory)."""
    background()
    workers.die_with_parent()


def _work_packed(packed: bytes) -> Done:
    """In the process: one job."""
    job: Job = pickle.loads(packed)  # our own job, from the process that spawned this one
    return evaluate_selectors(job)
