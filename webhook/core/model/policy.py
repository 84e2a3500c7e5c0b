"""The operator's choices the decisions depend on, as one frozen value (settings build it)."""

from collections.abc import Mapping
from dataclasses import field
from types import MappingProxyType

from webhook.core.model.values import value_class

_SERVICE_TYPES = MappingProxyType(
    {"ReplicaSet": "inference", "Deployment": "inference", "StatefulSet": "inference", "Job": "training"}
)
_PREEMPTABLE = MappingProxyType({"inference": "false", "training": "true"})

# What the chart's filters send the webhooks (its webhook.cardResourcePrefixes, whose default is this
# list, checked by a test): a pod asking a resource starting with none of these, naming no card and
# claiming no device, is never reviewed. It covers every resource name the code counts whatever the
# nodes say (NVIDIA's whole cards, MPS and MIG, DRA's implicit extended resources, Volcano vGPU, HAMi
# and Koordinator shares) and the device-plugin resources of the GPU vendors whose nodes discovery
# reads from their product labels. A node advertising a card resource outside it is warned of
# (status, an Event, a metric): discovery reads any vendor's labels, no static list can.
SENT_RESOURCE_PREFIXES = (
    "nvidia.com/",
    "deviceclass.resource.kubernetes.io/",
    "volcano.sh/vgpu-",
    "koordinator.sh/gpu",
    "kubernetes.io/gpu",
    "huawei.com/Ascend",
    "amd.com/",
    "gpu.intel.com/",
    "cambricon.com/",
    "hygon.com/",
    "metax-tech.com/",
    "iluvatar.ai/",
    "mthreads.com/",
    "enflame.com/",
    "kunlunxin.com/",
)


@value_class
class Policy:
    # A card that is in a quota but on no node takes these (MIG/MPS follow their own rules).
    default_resource: str = "nvidia.com/gpu"
    default_label_key: str = "nvidia.com/gpu.product"
    # A pod that requests a card resource but names no card: "deny" or "warn" (allow, warn).
    unnamed_card_pods: str = "deny"
    # Set volcano.sh/service.type on PodGroups from the owner kind.
    service_type: bool = False
    service_type_by_kind: Mapping[str, str] = field(default_factory=lambda: _SERVICE_TYPES)
    # With service_type on, also default volcano.sh/preemptable from the service type.
    preemptable_by_service_type: Mapping[str, str] = field(default_factory=lambda: _PREEMPTABLE)
    # How long an admitted demand is held while the cache has not seen it (seconds).
    in_flight_ttl: float = 30.0
    # Queues form trees through spec.parent: a child's card use also counts against every ancestor
    # that has a card quota.
    hierarchical_queues: bool = True
    # Also count the CPU and memory requests of Volcano-scheduled pods against their queue's
    # spec.capability, as the capacity-card scheduler plugin does (a resource it leaves out is 0).
    cpu_memory_check: bool = False
    # With the check on, a pod that uses cards is not charged CPU or memory: the plugin's
    # cardUnlimitedCpuMemory.
    card_unlimited_cpu_memory: bool = False
    # HAMi's scheduler.defaultMem and defaultCores: what a HAMi pod that asks no memory (MiB; 0 is
    # the whole card) or no compute (percent) is given, so what it is charged.
    hami_default_memory_mib: int = 0
    hami_default_cores: int = 0
    # What happens to a controller's card pod that does not fit now (SPEC §5c), unless its queue's
    # cardquota.volcano.sh/over-quota annotation says otherwise: "deny" (refused; its controller
    # waits in line and is told to retry when its cards free) or "wait" (admitted under a gate).
    over_quota: str = "deny"
    # Whether a quota refuses (decisions.md §34): "deny", "warn" (admitted, the refusal it would have
    # been told to the user and by an Event) or "audit" (admitted, told in the audit log, an Event and
    # a metric); a Queue's cardquota.volcano.sh/enforcement overrides it.
    enforcement: str = "deny"
    # Keep the waiting lines at all (off: refusals only; a controller retries on its own back-off).
    waiting_line: bool = True
    # Tidal reclaim (SPEC §5e): "on" (evict the training that holds the cards an admitted pod waits
    # for), "dry-run" (only report it) or "off"; a Queue's cardquota.volcano.sh/reclaim overrides it.
    reclaim: str = "on"
    # The drivers whose ResourceSlice devices are GPUs counted as cards (SPEC §4b).
    dra_drivers: tuple[str, ...] = ("gpu.nvidia.com", "hami-core-gpu.project-hami.io")
    # The schedulers whose pods a queue's capability limits (spec.schedulerName).
    volcano_schedulers: frozenset[str] = frozenset({"volcano"})
    # The resource prefixes the registered filters send (the chart's webhook.cardResourcePrefixes):
    # a node card resource outside them is warned of.
    sent_resource_prefixes: tuple[str, ...] = SENT_RESOURCE_PREFIXES
