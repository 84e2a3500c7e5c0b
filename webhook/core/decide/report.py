"""``cardquota status``: cluster cards, per-queue usage and the warnings an operator should see."""

from typing import Any

from webhook.core.decide import lending, reclaim_holds
from webhook.core.decide.capability import cpu_text, memory_text
from webhook.core.decide.messages import breakdown
from webhook.core.index.queues import quota_sums
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage, tree_usage
from webhook.core.model import keys
from webhook.core.model.cards import CardName, amount, figure
from webhook.core.model.objects import moment


def _devices(state: ClusterState, card: CardName) -> dict[str, Any]:
    """What ResourceSlices publish of ``card`` (SPEC §4b): their devices and nodes, when any."""
    nodes = {
        node: count
        for node in state.inventory.devices.nodes()
        if (found := state.nodes.get(node)) is not None and (count := dict(found.devices).get(card))
    }
    if not nodes:
        return {}
    return {"dra": {"devices": figure(sum(nodes.values())), "nodes": sorted(nodes)}}


ALL_NAMESPACES = "all namespaces"  # a queue without cardquota.volcano.sh/namespaces


def cluster_status(state: ClusterState, now: float = 0.0) -> dict[str, Any]:
    """``now``: seconds since the epoch, to tell reclaims still in progress (0: any not yet over)."""
    cards = {
        name: {
            "resource": total.resource,
            "label_key": total.label_key,
            "product": total.product,
            "nodes": len(total.nodes),
            "total": figure(total.total),
            **_devices(state, name),
        }
        for name, total in state.inventory.cards.items()
    }
    queues: dict[str, Any] = {}
    warnings = list(state.inventory.warnings())
    quota_sum = quota_sums(
        {q: info.quota for q, info in state.tree.queues.items() if info.quota}, state.tree.ancestors
    )
    standings = lending.Standings(state)
    for name in sorted(set(state.tree.queues) | set(state.tree.tallies)):
        info = state.tree.queues.get(name)
        usage = queue_usage(state, name)
        if info is None:
            warnings.append(f'queue "{name}" does not exist but pods use it')
        elif info.quota_error:
            warnings.append(f'queue "{name}": {info.quota_error}; the scheduler reads it as no quota')
        placement = usage.placement
        placed = {card for (_, card) in placement.placed}
        per_card = {}
        for card in sorted(set(usage.quota) | set(usage.fixed) | placed):
            use = usage.card(card, placement)
            per_card[card] = {
                "quota": figure(use.ceiling),
                "bound": figure(use.bound),
                "pending": figure(use.pending),
                "reserved": figure(use.reserved),
                "in_flight": figure(use.in_flight),
                "free": figure(use.quota - use.used),  # of what it may use now
                **standings.figures(name, card, use),
            }
            if use.used > use.ceiling:
                warnings.append(
                    f'queue "{name}" uses {amount(use.used)} {card}, above its quota of {amount(use.ceiling)}'
                )
            elif (borrowed := lending.borrows_too_much(state, name, card, use)) is not None:
                warnings.append(borrowed)
        queues[name] = per_card
    for card, total in sorted(quota_sum.items()):
        have = state.inventory.cluster_cards(card)
        if have is None and total:
            warnings.append(f"{card}: queues' quotas sum to {amount(total)} but no node carries it")
        elif have is not None and total > have:
            warnings.append(
                f"{card}: queues' quotas sum to {amount(total)} but the cluster has {amount(have)}"
            )
    off_model = []
    for claim, (pod, charged, allocated, counted) in sorted(state.claims.off_model.items()):
        off_model.append({"claim": claim, "pod": pod, "charged": charged, "allocated": allocated})
        how = (
            "counted as allocated"
            if counted == allocated
            else f"counted as {counted or charged}, the model of its pod's other devices"
        )
        warnings.append(
            f"resourceclaim {claim} of pod {pod} was allocated {allocated} but charged for {charged}: {how}"
        )
    unpublished: list[dict[str, Any]] = []
    for claim, (pod, devices, model) in sorted(state.claims.unpublished.items()):
        unpublished.append(
            {"claim": claim, "pod": pod, "devices": list(devices), "counted_as": model or None}
        )
        told = (
            f"counted as {len(devices)} {model} (the model its pod is known to use)"
            if model
            else "not counted: neither its pod nor its other devices tell their model"
        )
        warnings.append(
            f"resourceclaim {claim} of pod {pod} was allocated {', '.join(devices)}, which no"
            f" ResourceSlice the webhook has seen publishes: {told}"
        )
    warnings += [message for _, _, message in unsent(state)]
    notes = [*state.notes, *(f"{what}: skipped, {why}" for what, why in sorted(state.skipped.items()))]
    access = {
        name: info.record.annotations.get(keys.NAMESPACES, ALL_NAMESPACES)
        for name, info in sorted(state.tree.queues.items())
    }
    status = {
        "cards": cards,
        "queues": queues,
        "namespaces": access,
        "tree": _tree(state),
        "warnings": warnings,
        "notes": notes,
    }
    if off_model:
        status["claims_off_model"] = off_model
    if unpublished:
        status["claims_unpublished"] = unpublished
    if waiting := lines(state):
        status["lines"] = waiting
    if reclaims := reclaim_holds.in_progress(state, now):
        status["reclaims"] = reclaims
    if shared := state.inventory.shared():  # nodes that share their cards (Volcano vGPU, Koordinator)
        status["shared"] = {p: {**info, "cards": figure(info["cards"])} for p, info in shared.items()}
    if state.policy.cpu_memory_check:
        status["capability"] = _capability(state, warnings)
    return status


def lines(state: ClusterState, namespace: str = "") -> dict[str, list[dict[str, Any]]]:
    """Every queue's waiting line in order (docs/decisions.md §23); ``namespace``: only its waiters."""
    out: dict[str, list[dict[str, Any]]] = {}
    for queue in state.line.queues():
        entries = []
        for place, waiter in enumerate(state.line.line(queue), start=1):
            if namespace and waiter.namespace != namespace:
                continue
            entries.append(
                {
                    "place": place,
                    "workload": waiter.what,
                    "pods": state.waiting.waiting_pods(waiter),
                    "card": waiter.spec.text,
                    "per_pod": figure(waiter.per_pod),
                    "priority": waiter.priority,
                    "since": moment(waiter.since),
                }
            )
        if entries:
            out[queue] = entries
    return out


def lines_table(waiting: dict[str, list[dict[str, Any]]]) -> str:
    if not waiting:
        return "nothing waits"
    rows = [f"{'QUEUE':<16} PLACE  {'WORKLOAD':<41} PODS  {'EACH':<24} PRIORITY  SINCE"]
    for queue, entries in waiting.items():
        for e in entries:
            each = f"{e['per_pod']} {e['card']}"
            row = f"{queue:<16} {e['place']:>5}  {e['workload']:<41} {e['pods']:>4}  {each:<24}"
            rows.append(f"{row} {e['priority']:>8}  {e['since']}")
    return "\n".join(rows)


def _capability(state: ClusterState, warnings: list[str]) -> dict[str, Any]:
    """With the CPU/memory check on: per queue, CPU (millicores) and memory (bytes) against its
    spec.capability (None where it sets none: the check counts that as 0); a queue whose live pods
    request more than that is warned about (nothing is evicted)."""
    out: dict[str, Any] = {}
    for name in sorted(state.tree.queues):
        info = state.tree.queues[name]
        used = state.charged.compute_used(name)
        held = state.ledger.held_compute(name)
        out[name] = {}
        for i, (resource, limit, text) in enumerate(
            (("cpu", info.cpu, cpu_text), ("memory", info.memory, memory_text))
        ):
            out[name][resource] = {"capability": limit, "used": used[i], "in_flight": held[i]}
            if used[i] > (limit or 0):
                cap = "none set, so 0" if limit is None else text(limit)
                warnings.append(
                    f'queue "{name}": its pods request {text(used[i])} {resource}, above its capability'
                    f" ({cap}); nothing is evicted, new pods that request {resource} are refused"
                )
    return out


def _tree(state: ClusterState) -> dict[str, Any]:
    """Every queue with children: its parent, children, and its whole subtree's figures per card."""
    tree: dict[str, Any] = {}
    for name in sorted(state.tree.descendants):
        info = state.tree.queues.get(name)
        usage = tree_usage(state, name)
        placement = usage.placement
        cards = {}
        for card in sorted(set(usage.quota) | set(usage.fixed) | {c for (_, c) in placement.placed}):
            use = usage.card(card, placement)
            limited = card in usage.quota
            cards[card] = {
                "quota": figure(use.quota) if limited else None,
                "used": figure(use.used),
                "free": figure(use.quota - use.used) if limited else None,
            }
        tree[name] = {
            "parent": info.record.parent if info is not None else "",
            "children": sorted(q for q, chain in state.tree.ancestors.items() if chain[:1] == (name,)),
            "cards": cards,
        }
    return tree


def status_table(status: dict[str, Any]) -> str:
    lines = ["CARD                                      RESOURCE                 NODES  TOTAL"]
    for name, card in status["cards"].items():
        lines.append(f"{name:<41} {card['resource']:<24} {card['nodes']:>5}  {card['total']:>5}")
        if "dra" in card:
            dra = card["dra"]
            lines.append(f"  {dra['devices']} in ResourceSlices on {', '.join(dra['nodes'])}")
    for product, info in status.get("shared", {}).items():
        resources = ", ".join(f"{resource} {count}" for resource, count in info["resources"].items())
        lines.append(f"{product:<41} {info['cards']} more shared on {info['nodes']} node(s): {resources}")
    lines += ["", "QUEUE            CARD                                      QUOTA BOUND PEND  RSV  FREE"]
    for queue, per_card in status["queues"].items():
        for card, n in per_card.items():
            lines.append(
                f"{queue:<16} {card:<41} {n['quota']:>5} {n['bound']:>5} {n['pending']:>4}"
                f" {n['reserved']:>4} {n['free']:>5}"
            )
    lines += lending.table(status["queues"])
    restricted = {q: text for q, text in status.get("namespaces", {}).items() if text != ALL_NAMESPACES}
    if restricted:
        lines += ["", f"QUEUE            NAMESPACES THAT MAY USE IT ({keys.NAMESPACES})"]
        lines += [f"{queue:<16} {text}" for queue, text in restricted.items()]
        lines.append("every other queue: open to all namespaces")
    elif status.get("namespaces"):
        lines += ["", "every queue is open to all namespaces"]
    if status.get("tree"):
        lines += ["", "QUEUE TREE (a queue with children, counting all its queues)"]
        for queue, node in status["tree"].items():
            children = ", ".join(node["children"])
            lines.append(f"{queue} (parent: {node['parent'] or '-'}; children: {children})")
            for card, n in node["cards"].items():
                quota = n["quota"]
                limit = "no limit" if quota is None else f"quota {quota}, free {n['free']}"
                lines.append(f"  {card:<41} used {n['used']:>5}  {limit}")
    if "capability" in status:
        lines += [
            "",
            "QUEUE            CPU USED / CAPABILITY      MEMORY USED / CAPABILITY  (CPU/memory check)",
        ]
        for queue, both in status["capability"].items():
            cells = []
            for resource, text in (("cpu", cpu_text), ("memory", memory_text)):
                n = both[resource]
                limit = "none (0)" if n["capability"] is None else text(n["capability"])
                cells.append(f"{text(n['used'] + n['in_flight'])} / {limit}")
            lines.append(f"{queue:<16} {cells[0]:<26} {cells[1]}")
    if status.get("lines"):
        lines += ["", "WAITING LINES (first in line first)", lines_table(status["lines"])]
    if status.get("reclaims"):
        lines += ["", f"{'RECLAIMED FROM':<40} {'CARDS':<30} {'FOR QUEUE':<16} WAITING  HELD UNTIL"]
        for r in status["reclaims"]:
            cards, waiting = f"{r['cards']} {r['card']}", r["waiting_pods"]
            lines.append(
                f"{r['podgroup']:<40} {cards:<30} {r['for_queue']:<16} {waiting:>7}  {r['held_until']}"
            )
    lines += ["", "WARNINGS" if status["warnings"] else "no warnings"]
    lines += [f"- {w}" for w in status["warnings"]]
    if status["notes"]:
        lines += ["", "NOTES", *[f"- {n}" for n in status["notes"]]]
    return "\n".join(lines)


def overcommitted(state: ClusterState) -> list[tuple[str, CardName, int, str]]:
    """Every queue and card used above its quota (quota lowered, nodes lost, webhook bypassed):
    ``(queue, card, cards over, one-line message)``. Nothing is evicted; new pods wait."""
    found = []
    for name in sorted(state.tree.queues):
        usage = queue_usage(state, name)
        placement = usage.placement
        cards = set(usage.quota) | set(usage.fixed) | {c for (_, c) in placement.placed}
        for card in sorted(cards):
            use = usage.card(card, placement)
            if use.used > use.ceiling:
                message = (
                    f'queue "{name}" uses {amount(use.used)} {card}, above its quota ({breakdown(use)});'
                    " nothing is evicted, new pods wait until use falls below it"
                )
                found.append((name, card, use.used - use.ceiling, message))
    return found


def unsent(state: ClusterState) -> list[tuple[str, list[str], str]]:
    """Every card resource a node advertises that the registered filters never send (the policy's
    ``sent_resource_prefixes``, the chart's ``webhook.cardResourcePrefixes``): ``(resource, nodes,
    one-line message)``. A pod asking it without naming its card is never checked."""
    prefixes = state.policy.sent_resource_prefixes
    nodes: dict[str, list[str]] = {}
    for name, cards in sorted(state.inventory.by_node.items()):
        advertised = {card.resource for card in cards.cards} | {resource for resource, _ in cards.shared}
        for resource in advertised:
            if not resource.startswith(prefixes):
                nodes.setdefault(resource, []).append(name)
    return [(resource, names, _unsent_message(resource, names)) for resource, names in sorted(nodes.items())]


def _unsent_message(resource: str, nodes: list[str]) -> str:
    who = (
        f"nodes {nodes[0]} and {len(nodes) - 1} more advertise"
        if len(nodes) > 1
        else f"node {nodes[0]} advertises"
    )
    return (
        f"{who} card resource {resource}, which the webhooks' filters never send"
        " (webhook.cardResourcePrefixes): a pod asking it without volcano.sh/card.name is never checked;"
        " add its prefix to that list"
    )
