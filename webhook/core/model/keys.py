"""Annotation and label keys shared with Volcano and the capacity-card scheduler plugin."""

from typing import Final

CARD_QUOTA: Final = "volcano.sh/card.quota"
CARD_REQUEST: Final = "volcano.sh/card.request"
CARD_NAME: Final = "volcano.sh/card.name"
SERVICE_TYPE: Final = "volcano.sh/service.type"
PREEMPTABLE: Final = "volcano.sh/preemptable"
QUEUE_NAME: Final = "scheduling.volcano.sh/queue-name"
GROUP_NAME: Final = "scheduling.k8s.io/group-name"
TASK_SPEC: Final = "volcano.sh/task-spec"  # set by the Volcano controller on a Job's pods: the task
# Ours: the card spec a multi-card pod asked for, kept when the pod mutation assigns it one model
# (SPEC §5b); the pod's card.name then names that model.
CARD_SPEC: Final = "cardquota.volcano.sh/card.spec"
# Ours: a workload in the waiting line (deny mode), so a restarted or new leader rebuilds the line:
# {"since": "<RFC 3339 time its controller was first refused>", "priority": <the pod's priority>}.
WAITING: Final = "cardquota.volcano.sh/waiting"
# Ours: the scheduling gate a controller's pod waits under in wait mode (SPEC §5c); the pod then
# carries the WAITING mark too (its place). Only the webhook removes it.
GATE: Final = "cardquota.volcano.sh/waiting"
# Ours: written when a waiting workload is called, so its controller retries its creates at once.
CALLED: Final = "cardquota.volcano.sh/called"
# Ours, on a Queue: "deny" or "wait", what happens to a controller's pod that does not fit now.
OVER_QUOTA: Final = "cardquota.volcano.sh/over-quota"
# Ours, on a Queue: "deny", "warn" or "audit", whether its quota refuses (deny), or admits and says
# what it would have refused, to the user and in an Event (warn) or only in the audit log, an Event
# and a metric (audit); overrides the cluster's setting (decisions.md §34).
ENFORCEMENT: Final = "cardquota.volcano.sh/enforcement"
ENFORCEMENTS: Final = ("deny", "warn", "audit")
# Ours, on a Queue: "on", "dry-run" or "off", whether its pods take back cards of their model that
# training borrowed (tidal reclaim, SPEC §5e); overrides the cluster's setting.
RECLAIM: Final = "cardquota.volcano.sh/reclaim"
# Ours, on a Queue: "true" or "false", whether its training may give cards back to us; overrides
# spec.reclaimable (so Volcano's own reclaim can be kept off a queue we may still take back from).
RECLAIMABLE: Final = "cardquota.volcano.sh/reclaimable"
# Ours, on a Queue: a label selector over Namespaces (``kubectl get -l`` syntax) saying which may
# charge it (decisions.md §29); absent, every namespace may.
NAMESPACES: Final = "cardquota.volcano.sh/namespaces"
# The label every Namespace carries with its own name.
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
# Ours, on a PodGroup tidal reclaim evicted: {"card", "cards", "queue", "pods": [uids], "until"},
# what it gave back and for whom; it is held back while those pods wait (a new leader reads it).
RECLAIMED: Final = "cardquota.volcano.sh/reclaimed"

# Ours, on a pod whose GPUs come through ResourceClaims (SPEC §4b): the card spec of the requests
# whose class and selectors fix no model, where volcano.sh/card.name cannot say it (the capacity-card
# plugin asks a pod naming a card for its nvidia.com/gpu). On a DeviceClass: the card its devices are.
DRA_CARD: Final = "cardquota.volcano.sh/card"

# The pod annotations a pod's charge is read from (its card, its queue): fixed once it is charged
# (SPEC §4b, "a charge lives as long as its pod"). Its PodGroup's name counts too once it has one
# (Volcano's controller names the PodGroup of a pod created without one, after the pod).
CHARGED: Final = (CARD_NAME, DRA_CARD, CARD_SPEC, QUEUE_NAME)

MPS_REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"
MIG_PREFIX: Final = "nvidia.com/mig-"
MPS_RESOURCE: Final = "nvidia.com/gpu.shared"

DEFAULT_QUEUE: Final = "default"
# Ours, on a Queue: what it is entitled to of each model it names, the card.quota's JSON shape
# (decisions.md §33); each named model is lent while idle and borrowed up to the card.quota.
# Absent: the quota is a wall, nothing lent or borrowed (a model it does not name, likewise).
CARD_DESERVED: Final = "cardquota.volcano.sh/card.deserved"
# Ours, on a Queue: how much of its deserved it may lend, per model (Kueue's lendingLimit);
# a model not named lends all of its idle deserved.
CARD_LENDABLE: Final = "cardquota.volcano.sh/card.lendable"
# Ours, on a PodGroup or pod admitted on borrowed cards: {"card": ..., "cards": n, "from": [queues]}.
BORROWING: Final = "cardquota.volcano.sh/borrowing"
# Ours, on a Queue: how long its gangs run before cards they borrow from its cohort may be taken
# back (KAI's reclaimMinRuntime), a duration such as "10m"; absent, none.
RECLAIM_MIN_RUNTIME: Final = "cardquota.volcano.sh/reclaim-min-runtime"
# Ours, on a Queue: how long before its gangs are evicted by a reclaim they are told (a duration
# such as "2m"; absent, none: the notice is written just before the evictions).
RECLAIM_NOTICE: Final = "cardquota.volcano.sh/reclaim-notice"
# Ours, on each pod of a gang a reclaim evicts, written before its eviction:
# {"evict": <when>, "deadline": <when killed if still running>, "for": queue, "card", "cards"}.
EVICTING: Final = "cardquota.volcano.sh/evicting"
# Ours, on a CardQuotaWouldRefuse Event: the would-be refusals it counts, {"queue", "card", "mode"}
# (``kubectl cardquota audit`` adds up the Events' counts; decisions.md §34).
WOULD_REFUSE: Final = "cardquota.volcano.sh/would-refuse"
# The reason of those Events (written by the serving replica, listed by ``kubectl cardquota audit``).
WOULD_REFUSE_REASON: Final = "CardQuotaWouldRefuse"
