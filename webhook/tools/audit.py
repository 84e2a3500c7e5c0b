"""What enforcement would refuse now (decisions.md §34): ``cardquota audit`` on a snapshot or a
cluster, ``kubectl cardquota audit``.

Per queue and model: its enforcement, its quota (what it may use now, for a model it lends and
borrows), what it uses, and by how much it runs past it. Per workload with card pods (a Deployment, a
StatefulSet, a ReplicaSet no Deployment owns, each card task of a Volcano Job): its queue and model,
its replicas, and whether its next scale-up (one more replica) and a pod of it re-created (deleted,
then made again by its controller) would be refused, each decided as the validating webhook decides
under ``deny``, whatever the queue's mode: what switching it to ``deny`` would mean. And per queue
and card, the would-be refusals its quota has admitted in the mode it is in now, with the first's
time: what the serving replica's ``CardQuotaWouldRefuse`` Events count (their ``would-refuse``
annotation says whose; the API server keeps Events for its ``--event-ttl``, an hour by default).
"""

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model import keys
from webhook.core.model.cards import figure
from webhook.core.model.demand import PodDemand, pod_demand
from webhook.errors import ConfigError
from webhook.tools import headroom

KINDS = {"Deployment": "deployment", "StatefulSet": "statefulset", "ReplicaSet": "replicaset"}


def report(state: ClusterState, now: float, events: Iterable[Any] | str = ()) -> dict[str, Any]:
    """The queues' figures, the workloads enforcement would refuse and the would-be refusals the
    ``CardQuotaWouldRefuse`` ``events`` count (a string: why they could not be read), as JSON."""
    modes = {name: state.enforcement(name) for name in state.tree.queues}
    with state.enforcing():
        queues = _queues(state, modes)
        found: dict[str, Any] = {"queues": queues, "workloads": _workloads(state, queues, now)}
    if isinstance(events, str):
        found["would_refuse"], found["note"] = None, events
    else:
        found["would_refuse"] = [row for row in told(events) if modes.get(row["queue"]) == row["mode"]]
    return found


def told(events: Iterable[Any]) -> list[dict[str, Any]]:
    """Per queue, card and mode: how many would-be refusals the Events count, and when the first
    was admitted. An Event not ours, or in an odd shape, counts nothing."""
    counted: dict[tuple[str, str, str], list[Any]] = {}
    for event in events:
        whose = _whose(event)
        if whose is None:
            continue
        count = event.get("count")
        count = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
        first = _when(event.get("firstTimestamp")) or _when(event.get("eventTime"))
        row = counted.setdefault(whose, [0, None])
        row[0] += count
        if first is not None and (row[1] is None or first < row[1]):
            row[1] = first
    return [
        {
            "queue": queue,
            "card": card,
            "mode": mode,
            "refusals": n,
            "since": since.strftime("%Y-%m-%dT%H:%M:%SZ") if since else "",
        }
        for (queue, card, mode), (n, since) in sorted(counted.items())
    ]


def _whose(event: Any) -> tuple[str, str, str] | None:
    if not isinstance(event, dict) or event.get("reason") != keys.WOULD_REFUSE_REASON:
        return None
    meta = event.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    text = annotations.get(keys.WOULD_REFUSE) if isinstance(annotations, dict) else None
    try:
        said = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(said, dict):
        return None
    queue, card, mode = (said.get(field) for field in ("queue", "card", "mode"))
    if not all(isinstance(v, str) and v for v in (queue, card)) or mode not in ("warn", "audit"):
        return None
    return queue, card, mode  # type: ignore[return-value]


def _when(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _queues(state: ClusterState, modes: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    for name in sorted(state.tree.queues):
        info = state.tree.queues[name]
        if not info.quota:
            continue
        usage = queue_usage(state, name)
        for card in sorted(info.quota):
            use = usage.card(card)
            rows.append(
                {
                    "queue": name,
                    "card": card,
                    "enforcement": modes[name],
                    "quota": figure(use.quota),
                    "used": figure(use.used),
                    "over": figure(max(0, use.used - use.quota)),
                }
            )
    return rows


def _workloads(state: ClusterState, queues: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    over = {(row["queue"], row["card"]) for row in queues if row["over"]}
    rows = []
    for workload in sorted(state.workloads.by_uid.values(), key=lambda w: (w.kind, w.namespace, w.name)):
        if workload.kind in KINDS and not (workload.kind == "ReplicaSet" and workload.owner is not None):
            answers = [headroom.of_workload(state, f"{KINDS[workload.kind]}/{workload.key}", now)]
        elif workload.kind == "Job" and workload.tasks and workload.tasks[0].template is not None:
            try:
                answers = headroom.of_job(state, workload.namespace, workload.name, now)
            except ConfigError:  # no task uses cards
                continue
        else:
            continue
        queue = state.template_queue(workload).queue
        for task, answer in zip(workload.tasks, answers, strict=False):
            demand = pod_demand(task.template, state.inventory, state.policy)
            if not isinstance(demand, PodDemand):
                continue
            cards = demand.spec.cards
            rows.append(
                {
                    "workload": answer.target,
                    "queue": queue,
                    "card": demand.spec.text,
                    "replicas": answer.replicas,
                    "next_scale_up": "admitted" if answer.more != 0 else "refused",
                    "why": answer.reason if answer.more == 0 else "",
                    "pod_recreated": "refused" if all((queue, c) in over for c in cards) else "admitted",
                }
            )
    return rows


def table(found: dict[str, Any]) -> str:
    lines = [f"{'QUEUE':<16} {'CARD':<40} {'ENFORCEMENT':<11} {'QUOTA':>6} {'USED':>6} {'OVER':>6}"]
    for row in found["queues"]:
        lines.append(
            f"{row['queue']:<16} {row['card']:<40} {row['enforcement']:<11} {_n(row['quota']):>6}"
            f" {_n(row['used']):>6} {_n(row['over']):>6}"
        )
    head = f"{'WORKLOAD':<48} {'QUEUE':<16} {'CARD':<28} {'REPLICAS':>8}  NEXT SCALE-UP  POD RE-CREATED"
    lines += ["", head]
    for row in found["workloads"]:
        lines.append(
            f"{row['workload']:<48} {row['queue']:<16} {row['card']:<28} {row['replicas']:>8}"
            f"  {row['next_scale_up']:<13}  {row['pod_recreated']}"
        )
    refused = [row for row in found["workloads"] if row["why"]]
    if refused:
        lines += ["", "WHY THE NEXT SCALE-UP WOULD BE REFUSED"]
        lines += [f"{row['workload']}: {row['why']}" for row in refused]
    lines += ["", "WOULD-BE REFUSALS ADMITTED IN THE QUEUE'S MODE (from its CardQuotaWouldRefuse Events)"]
    if found.get("would_refuse") is None:
        lines.append(found.get("note", "the Events were not read"))
    elif not found["would_refuse"]:
        lines.append("none: no queue in warn or audit has admitted one (or its Events have expired)")
    else:
        lines.append(f"{'QUEUE':<16} {'CARD':<40} {'MODE':<6} {'REFUSALS':>8}  SINCE")
        for row in found["would_refuse"]:
            lines.append(
                f"{row['queue']:<16} {row['card']:<40} {row['mode']:<6} {row['refusals']:>8}  {row['since']}"
            )
    return "\n".join(lines)


def _n(value: float) -> str:
    return f"{value:g}"
