"""Where the state comes from: the seam between the server and whatever keeps the state current.

The server reads ``source.state`` and ``source.ready``; it never knows which source it has. The
snapshot source loads a directory once; the live cache (list+watch) is another implementation.
"""

import asyncio
from pathlib import Path
from typing import Protocol

from webhook import snapshot
from webhook.core.policy import Policy
from webhook.core.state import ClusterState


class StateSource(Protocol):
    @property
    def state(self) -> ClusterState | None: ...

    @property
    def ready(self) -> bool: ...

    async def run(self) -> None:
        """Bring the state up to date and keep it so; raise ``ConfigError`` if it cannot."""


class SnapshotSource:
    """A snapshot directory, loaded once in a worker thread; ready when loaded."""

    def __init__(self, directory: Path, policy: Policy) -> None:
        self.directory, self.policy = directory, policy
        self._state: ClusterState | None = None

    @property
    def state(self) -> ClusterState | None:
        return self._state

    @property
    def ready(self) -> bool:
        return self._state is not None

    async def run(self) -> None:
        self._state = await asyncio.to_thread(snapshot.load_snapshot, self.directory, self.policy)
