"""The optional CPU/memory check: a queue's ``spec.capability`` limits the CPU and memory requests of
its Volcano-scheduled pods, with the capacity-card scheduler plugin's semantics (a resource the
capability leaves out is 0; ``cardUnlimitedCpuMemory`` exempts pods that use cards)."""

from webhook.core.index.state import ClusterState
from webhook.core.model.verdicts import Denied

GiB, MiB, KiB = 2**30, 2**20, 2**10


def cpu_text(millicores: int) -> str:
    """``2``, ``1.5``, ``500m``, ``1250m``: how kubectl users write CPU."""
    if millicores % 1000 == 0:
        return str(millicores // 1000)
    if millicores > 1000 and millicores % 100 == 0:
        return f"{millicores / 1000:g}"
    return f"{millicores}m"


def memory_text(size: int) -> str:
    """``4Gi``, ``1536Mi``, ``100Ki`` or bytes: the largest binary unit that states it exactly."""
    for unit, suffix in ((GiB, "Gi"), (MiB, "Mi"), (KiB, "Ki")):
        if size and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def refuses(
    state: ClusterState, queue: str, what: str, cpu: int, memory: int, pods: int = 1, exclude: str = ""
) -> Denied | None:
    """Why ``pods`` more pods requesting ``cpu`` and ``memory`` each do not fit ``queue``'s
    capability, counting its live pods and what was admitted but not seen yet; None when they fit.
    A queue the state does not know is left to the scheduler (only card pods need a known queue)."""
    info = state.tree.queues.get(queue)
    if info is None:
        return None
    used = state.charged.compute_used(queue)
    held = state.ledger.held_compute(queue, exclude)
    for index, (name, need, capability, text) in enumerate(
        (("cpu", cpu, info.cpu, cpu_text), ("memory", memory, info.memory, memory_text))
    ):
        if need <= 0:
            continue
        total = need * pods
        each = f" ({text(need)} per pod)" if pods > 1 else ""
        if capability is None:
            return Denied(
                f'queue "{queue}" sets no {name} in spec.capability, so it admits no pod that requests'
                f" {name} (the CPU/memory check counts a missing resource as 0); {what} needs"
                f" {text(total)} {name}{each}",
                queue=queue,
            )
        in_use, in_flight = used[index], held[index]
        if in_use + in_flight + total <= capability:
            continue
        parts = [f"{text(in_use)} requested by its pods"] if in_use else []
        parts += [f"{text(in_flight)} admitted, not yet seen"] if in_flight else []
        detail = f"capability {text(capability)}" + (f": {', '.join(parts)}" if parts else "")
        left = max(0, capability - in_use - in_flight)
        needs = f"{what} needs {text(total)} {name}{each}"
        return Denied(f'queue "{queue}" has {text(left)} {name} left ({detail}); {needs}', queue=queue)
    return None
