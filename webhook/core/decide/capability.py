"""The optional CPU/memory check: a queue's ``spec.capability`` limits the CPU and memory requests of
its Volcano-scheduled pods, with the capacity-card scheduler plugin's semantics (a resource the
capability leaves out is 0; ``cardUnlimitedCpuMemory`` exempts pods that use cards); and what an
in-place resize of a pod adds (``pods/resize``)."""

from webhook.core.index.state import ClusterState
from webhook.core.model.ledger import resize_key
from webhook.core.model.objects import TERMINAL_PHASES, reviewed_pod
from webhook.core.model.verdicts import Allowed, Decision, Denied, Hold, Request

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
    state: ClusterState,
    queue: str,
    what: str,
    cpu: int,
    memory: int,
    pods: int = 1,
    exclude: str = "",
    resized: tuple[int, int] | None = None,
) -> Denied | None:
    """Why ``pods`` more pods requesting ``cpu`` and ``memory`` each do not fit ``queue``'s
    capability, counting its live pods and what was admitted but not seen yet; None when they fit.
    ``resized``: the pod's requests before a resize that adds ``cpu`` and ``memory`` to them.
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
        if resized is not None:
            was = resized[index]
            needs = f"{what} from {text(was)} to {text(was + total)} {name} needs {text(total)} {name} more"
        else:
            each = f" ({text(need)} per pod)" if pods > 1 else ""
            needs = f"{what} needs {text(total)} {name}{each}"
        if capability is None:
            return Denied(
                f'queue "{queue}" sets no {name} in spec.capability, so it admits no pod that requests'
                f" {name} (the CPU/memory check counts a missing resource as 0); {needs}",
                queue=queue,
            )
        in_use, in_flight = used[index], held[index]
        if in_use + in_flight + total <= capability:
            continue
        parts = [f"{text(in_use)} requested by its pods"] if in_use else []
        parts += [f"{text(in_flight)} admitted, not yet seen"] if in_flight else []
        detail = f"capability {text(capability)}" + (f": {', '.join(parts)}" if parts else "")
        left = max(0, capability - in_use - in_flight)
        return Denied(f'queue "{queue}" has {text(left)} {name} left ({detail}); {needs}', queue=queue)
    return None


def decide_resize(state: ClusterState, request: Request) -> Decision:
    """An in-place resize (``pods/resize`` UPDATE: the whole pod, with its containers' new
    resources), checked as ResourceQuota checks one: what it adds to the pod's CPU and memory
    requests (the new less the old) must fit its queue's capability; a resize that lowers or keeps
    them passes. What it adds is held until the cache sees the pod resized."""
    new = reviewed_pod(request.obj, request.namespace, request.template)
    charged = state.compute_charged(new.template)
    if charged is None:
        return Allowed("the pod's CPU and memory are not counted")
    if new.phase in TERMINAL_PHASES or new.waiting is not None:
        return Allowed("the pod is charged nothing: it has finished, or waits under the scheduling gate")
    old = reviewed_pod(request.old_obj, request.namespace) if request.old_obj else None
    was = (state.compute_charged(old.template) if old is not None else None) or (0, 0)
    cpu, memory = max(0, charged[0] - was[0]), max(0, charged[1] - was[1])
    if not cpu and not memory:
        return Allowed("the resize asks no more CPU or memory")
    queue = state.queue_of_pod(state.pods.get(new.uid) or new)
    what = f"resize of pod {new.namespace}/{new.name or request.name}"
    over = refuses(state, queue, what, cpu, memory, resized=was)
    if over is not None:
        return over
    key = resize_key(new.uid)
    before = state.ledger.get(key)  # an earlier resize the cache has not seen yet: it still counts
    if before is not None:
        cpu, memory = cpu + before.cpu, memory + before.memory
    hold = Hold(key, queue, None, 0, 1, cpu=cpu, memory=memory)
    return Allowed("the resize fits the queue's capability", hold=hold, queue=queue)
