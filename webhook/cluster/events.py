"""The Events the serving replica records (the line's, lending's, enforcement's, reclaim's): one
place that writes them, where one that cannot be written is logged and not retried (an Event tells;
nothing is decided from it)."""

import logging
from typing import Any

from webhook.cluster.cache import Transport, Unavailable
from webhook.core.model.objects import PodGroupRecord, event_targets

log = logging.getLogger(__name__)


async def tell(
    transport: Transport,
    namespace: str,
    involved: dict[str, str],
    reason: str,
    message: str,
    kind: str = "Normal",
    **more: Any,
) -> None:
    """An Event about ``involved`` in ``namespace``; ``more``: its count, since and annotations."""
    try:
        await transport.record_event(namespace, involved, reason, message, kind, **more)
    except Unavailable as exc:
        what = f"{involved.get('kind', '')} {namespace}/{involved.get('name', '')}"
        log.warning("could not record an Event", extra={"object": what, "reason": reason, "error": str(exc)})


async def tell_group(
    transport: Transport, group: PodGroupRecord, reason: str, message: str, kind: str = "Warning"
) -> None:
    """An Event on a PodGroup and on its Volcano Job (what ``kubectl describe vcjob`` shows)."""
    for target in event_targets(group):
        await tell(transport, group.namespace, target, reason, message, kind)
