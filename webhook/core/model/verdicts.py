"""What a decision returns: ``Allowed | Denied``, a closed union consumed with ``match``."""

from collections.abc import Mapping
from typing import Any

from webhook.core.model.cards import CardSpec
from webhook.core.model.demand import PodDemand
from webhook.core.model.ledger import Cover
from webhook.core.model.objects import PodTemplate
from webhook.core.model.values import value_class

PatchOp = Mapping[str, Any]


@value_class
class Hold:
    """Demand to record in the in-flight ledger once the request is really admitted."""

    key: str
    queue: str
    spec: CardSpec | None  # None: only CPU/memory is held
    per_pod: int
    pods: int
    transfer_from: tuple[str, ...] = ()  # entries this hold takes over: its scale-up's, its assignment's
    cpu: int = 0  # per pod, when the CPU/memory check charges it
    memory: int = 0
    assignment: bool = False  # a multi-card pod's assigned model, held from mutation to validation
    covers: Cover | None = None  # the flexible demand the held pod comes out of
    task: str = ""  # the Volcano Job task of the held pod ("<job uid>/<task>")
    claims: tuple[str, ...] = ()  # claims by name ("namespace/name") the held pod is charged for
    demand: PodDemand | None = None  # a DRA pod's demand as admitted (it is charged so while it lives)
    # the annotations its charge is read from as admitted (keys.CHARGED): an edit the cache sees
    # before the pod itself moves nothing; None when the hold is no pod's
    charged: tuple[tuple[str, str], ...] | None = None


@value_class
class Borrowed:
    """An admission of ``card`` while its queue uses ``beyond`` of it past its ``deserved``, on cards
    the queues ``lenders`` of its cohort lend (decisions.md §33): what its borrowing mark says."""

    card: str
    beyond: int  # the queue's use of the model past its deserved, this admission counted
    deserved: int
    lenders: tuple[str, ...]


@value_class
class Borrowing:
    """An admission on borrowed cards its Event and mark are still to be written for."""

    told: str  # the Event's message; "" when its admission warning reached its user
    borrowed: tuple[Borrowed, ...]
    at: float  # when it was admitted


@value_class
class Allowed:
    reason: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[PatchOp, ...] = ()
    hold: Hold | None = None
    queue: str = ""
    card: str = ""
    more: tuple[Hold, ...] = ()  # further holds: a PodGroup enqueued with several card specs
    gated: tuple[str, str] | None = None  # (owner uid, pod name) of a pod this mutation put under our gate
    # what its warnings are told on by an Event too ("pod:<ns>/<name>", "podgroup:<ns>/<name>"): an
    # admission on borrowed cards whose warning no user's kubectl prints (a controller's create)
    told: str = ""
    # what it marks as borrowing ("pod:<ns>/<name>", "podgroup:<ns>/<name>") and with what
    marked: str = ""
    borrowed: tuple[Borrowed, ...] = ()
    would: "Would | None" = None  # admitted though its quota has no room: its queue warns or audits


@value_class
class Would:
    """The refusal an admission would have been, its queue enforcing in ``mode`` ("warn", "audit")."""

    mode: str
    message: str  # exactly the refusal's
    involved: tuple[str, str, str, str] | None  # (apiVersion, kind, namespace, name) its Event is on
    queue: str = ""  # the queue whose quota has no room, and the card it has none of
    card: str = ""


@value_class
class Join:
    """A refused controller (deny mode) that takes its place in its queue's waiting line."""

    uid: str  # the ReplicaSet, StatefulSet or batch Job; or a PodGroup refused at enqueue
    priority: int  # its refused pod's
    group: str = ""  # the PodGroup's key (namespace/name), when it is one


TOO_COMPLEX = "too complex"  # a denial because the exact check gave up at its guard (fail closed)
WAITS = "waits"  # a wait-mode controller's pod that does not fit now: the mutation gates it instead
ENQUEUE = "enqueue"  # a PodGroup's move to Inqueue refused (the enqueue gate): its users are told


@value_class
class Denied:
    message: str
    code: int = 403
    queue: str = ""
    card: str = ""
    cause: str = ""  # "" for a quota or shape denial; TOO_COMPLEX when the check gave up
    release: tuple[str, ...] = ()  # ledger entries the denied request had held (its assignment)
    join: Join | None = None  # the controller that waits in line for its cards (deny mode)
    podgroup: str = ""  # a PodGroup refused at enqueue (namespace/name): told by an Event
    # a refusal for want of room in a quota (now, or ever): its queue's enforcement decides whether
    # it refuses (decisions.md §34); shape, trust and fail-closed refusals always do
    quota: bool = False
    hold: Hold | None = None  # what it would hold, admitted after all (a quota that only warns)


Decision = Allowed | Denied


@value_class
class Request:
    """An admission request, as the core needs it."""

    uid: str
    kind: str  # e.g. "Pod", "Scale", "Deployment", "Job", "Queue", "PodGroup"
    group: str  # API group of the kind
    resource: str  # e.g. "pods", "deployments"
    sub_resource: str
    operation: str
    namespace: str
    name: str
    obj: Mapping[str, Any]
    old_obj: Mapping[str, Any]
    dry_run: bool = False
    # ``obj``'s pod template (containers, annotations, claims), read once at the entry when it is a
    # pod whose shape the core can read (``admission.pod_template``); the rest of its record is built by
    # the step that needs it (the validation), not by the mutation, which reads only this
    template: PodTemplate | None = None

    @property
    def target(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name
