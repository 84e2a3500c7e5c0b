"""The claims' bookkeeping (SPEC §4b): which pods use each claim and template, who pays each claim
by name, what each DRA pod is charged for while it lives, and the claims allocated another model.

One rule says who pays a claim several pods share (``payer``): its live payer, else a pod admitted
as its payer that the cache has not seen yet; the pod that asks pays only when neither exists. The
index charges by it, the pod admission refuses or discounts by it, and the PodGroup mutation
reserves by it. A DRA pod's demand is fixed the first time it is charged (or when it arrives, to
what it was admitted with): a template replaced, a class edited or deleted afterwards changes
nothing it holds. Once every claim of a pod is allocated, it is charged what they were given, each
device's card read through the slices, whatever its classes say or whether they still exist: the
same after a restart as before it, in whatever order the objects reach the cache.
"""

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import replace

from webhook.core.index.tally import Charge
from webhook.core.model.cards import CardName
from webhook.core.model.claims import Devices, Given, claims_given
from webhook.core.model.demand import Demand, PodDemand
from webhook.core.model.devices import ClaimRecord, ClassRecord, TemplateRecord
from webhook.core.model.objects import PodRecord

Holder = tuple[str, str, str]  # (queue, pod uid, pod as messages name it)


def claim_keys(pod: PodRecord) -> list[str]:
    """The claims (``namespace/name``) and templates (``template:namespace/name``) ``pod`` uses."""
    namespace = pod.template.namespace or pod.namespace
    out = []
    for ref in pod.template.claims:
        if ref.claim:
            out.append(f"{namespace}/{ref.claim}")
        if ref.template:
            out.append(f"template:{namespace}/{ref.template}")
        if ref.generated:
            out.append(f"{namespace}/{ref.generated}")
    return out


class ClaimBook:
    def __init__(
        self, pods: Mapping[str, PodRecord], devices: Devices, queue_of: Callable[[PodRecord], str]
    ) -> None:
        self._pods, self._devices, self._queue_of = pods, devices, queue_of
        self._users: defaultdict[str, set[str]] = defaultdict(set)  # claim or template -> pod uids
        self._payers: dict[str, str] = {}  # claim by name -> the pod uid it is charged to
        # claim -> (queue, pod uid, expiry) of a pod admitted as its payer the cache has not seen
        self._expected: dict[str, tuple[str, str, float]] = {}
        self._fixed: dict[str, PodDemand] = {}  # pod uid -> the demand it was admitted or first charged with
        self._given: dict[str, PodDemand] = {}  # pod uid -> what its claims, all allocated, were given
        self._pools: defaultdict[tuple[str, str], set[str]] = defaultdict(set)  # (driver, pool) -> claims
        # claim key -> (its pod, the model the pod was charged for, the model it was allocated, the
        # model it is counted on: that one, or, for a pod of devices of several, its other devices')
        self.off_model: dict[str, tuple[str, str, CardName, CardName | None]] = {}
        # claim key -> (its pod, its devices no slice publishes, the model they are counted on or "")
        self.unpublished: dict[str, tuple[str, tuple[str, ...], str]] = {}

    # ---- the DRA objects: each answers the pods to charge again -----------------------------
    def put_class(self, record: ClassRecord) -> set[str]:
        if self._devices.classes.get(record.name) == record:
            return set()
        self._devices.classes[record.name] = record
        return self.claimants()

    def drop_class(self, name: str) -> set[str]:
        return self.claimants() if self._devices.classes.pop(name, None) is not None else set()

    def put_claim(self, record: ClaimRecord) -> set[str]:
        old = self._devices.claims.get(record.key)
        if old == record:
            return set()
        self._devices.claims[record.key] = record
        self._pooled(old, record)
        return set(self.users(record.key))

    def drop_claim(self, key: str) -> set[str]:
        old = self._devices.claims.pop(key, None)
        if old is None:
            return set()
        self._pooled(old, None)
        return set(self.users(key))

    def _pooled(self, old: ClaimRecord | None, new: ClaimRecord | None) -> None:
        """Keep which claims were allocated devices of each pool (a slice's ``driver``/``pool``)."""
        if old is not None:
            for where in {(d.driver, d.pool) for d in old.allocated}:
                claims = self._pools[where]
                claims.discard(old.key)
                if not claims:
                    del self._pools[where]
        if new is not None:
            for where in {(d.driver, d.pool) for d in new.allocated}:
                self._pools[where].add(new.key)

    def in_pool(self, driver: str, pool: str) -> set[str]:
        """The pods of the claims allocated devices of a pool: their charge reads its slices."""
        return {uid for key in self._pools.get((driver, pool), ()) for uid in self.users(key)}

    def put_template(self, record: TemplateRecord) -> set[str]:
        if self._devices.templates.get(record.key) == record:
            return set()
        self._devices.templates[record.key] = record
        return set(self.users(f"template:{record.key}"))

    def drop_template(self, key: str) -> set[str]:
        found = self._devices.templates.pop(key, None) is not None
        return set(self.users(f"template:{key}")) if found else set()

    # ---- who uses what ----------------------------------------------------------------------
    def join(self, pod: PodRecord) -> None:
        for key in claim_keys(pod):
            self._users[key].add(pod.uid)

    def users(self, key: str) -> set[str]:
        return self._users.get(key, set())

    def claimants(self) -> set[str]:
        """Every pod that uses a claim or a template."""
        return {uid for users in self._users.values() for uid in users}

    def leave(self, pod: PodRecord) -> list[str]:
        """``pod`` is counted no more; answers the pods that may pay for its claims now, in order."""
        heirs: set[str] = set()
        self._fixed.pop(pod.uid, None)
        self._given.pop(pod.uid, None)
        for key in claim_keys(pod):
            self.off_model.pop(key, None)
            if self.unpublished.get(key, ("",))[0] == pod.key:
                del self.unpublished[key]
            users = self._users.get(key)
            if users is not None:
                users.discard(pod.uid)
                if not users:
                    del self._users[key]
            if self._payers.get(key) == pod.uid:
                del self._payers[key]
                heirs |= set(users or ())
        return sorted(heirs)

    # ---- what a pod is charged for ----------------------------------------------------------
    def fixed(self, uid: str) -> PodDemand | None:
        """What pod ``uid`` is charged for: what its claims were given once all are allocated, else
        what it was admitted or first charged with."""
        return self._given.get(uid) or self._fixed.get(uid)

    def held(self, uid: str) -> PodDemand | None:
        """What pod ``uid`` was admitted or first charged with."""
        return self._fixed.get(uid)

    def fix(self, uid: str, demand: Demand) -> PodDemand | None:
        """Pod ``uid`` is charged ``demand`` while it lives, unless fixed already: answers what it
        is charged (None: no card)."""
        return self._fixed.setdefault(uid, demand) if isinstance(demand, PodDemand) else self._fixed.get(uid)

    def given(self, pod: PodRecord, fallback: CardName | None) -> Given | None:
        """What ``pod``'s claims were given, once every one is allocated (``claims_given``)."""
        namespace = pod.template.namespace or pod.namespace
        return claims_given(pod.template.claims, namespace, self._devices, fallback)

    def settle(self, pod: PodRecord, found: Given | None, demand: PodDemand | None) -> None:
        """Pod ``pod``'s claims were ``found`` given ``demand`` (None: not all allocated yet, or no
        GPU): what it is charged for while they stay so; its devices no slice publishes are told."""
        for key in claim_keys(pod):
            if self.unpublished.get(key, ("",))[0] == pod.key:
                del self.unpublished[key]
        if demand is None:
            self._given.pop(pod.uid, None)
        else:
            self._given[pod.uid] = demand
        if found is None:
            return
        devices: defaultdict[str, list[str]] = defaultdict(list)
        for key, device in found.unpublished:
            devices[key].append(device)
        counted = found.card if found.card is not None else ""
        for key, listed in devices.items():
            self.unpublished[key] = (pod.key, tuple(listed), counted)

    def admitted(self, uid: str, name: str) -> int | None:
        """The units pod ``uid`` was admitted (or first charged) with for its entry ``name`` from a
        template: what the claim made for it must not exceed."""
        fixed = self._fixed.get(uid)
        return None if fixed is None or fixed.claims is None else dict(fixed.claims.from_templates).get(name)

    # ---- who pays ---------------------------------------------------------------------------
    def payer(self, key: str, asking: str, now: float | None = None) -> str | None:
        """The pod (uid) claim ``key`` is charged to, if not pod ``asking``: its live payer, else a
        pod admitted as its payer that the cache has not seen yet (until ``now`` passes its hold)."""
        uid = self._payers.get(key)
        if uid is not None and uid != asking and (pod := self._pods.get(uid)) is not None and pod.is_live:
            return uid
        expected = self._expected.get(key)
        if (
            expected is None
            or expected[1] == asking
            or expected[1] in self._pods
            or (now is not None and expected[2] < now)
        ):
            return None
        return expected[1]

    def holder(self, key: str, asking: str, now: float) -> Holder | None:
        """``payer`` as the admission tells it: (queue, pod uid, pod)."""
        uid = self.payer(key, asking, now)
        if uid is None:
            return None
        pod = self._pods.get(uid)
        if pod is not None:
            return self._queue_of(pod), uid, pod.key
        queue, _, _ = self._expected[key]
        return queue, uid, f"{key.split('/', 1)[0]}/… (admitted, not yet seen)"

    def unpaid(self, pod: PodRecord, demand: PodDemand) -> int:
        """The units of ``demand``'s claims by name other pods pay for (the PodGroup mutation)."""
        named = demand.claims.named if demand.claims is not None else ()
        return sum(units for key, units in named if self.payer(key, pod.uid) is not None)

    def expect(self, key: str, queue: str, uid: str, until: float) -> None:
        """A pod admitted as the payer of claim ``key``, until the cache sees it (or ``until``)."""
        self._expected[key] = (queue, uid, until)

    def expire(self, now: float) -> list[str]:
        """Forget the admitted payers seen or past their hold; answers the pods to charge again."""
        if not self._expected:
            return []
        gone = [k for k, (_, uid, until) in self._expected.items() if until < now or uid in self._pods]
        out: list[str] = []
        for key in gone:  # never seen: the claim's pods in the cache pay for it again
            del self._expected[key]
            out.extend(self.users(key))
        return out

    def charge(self, pod: PodRecord, charge: Charge | None, demand: PodDemand | None) -> Charge | None:
        """A live claiming pod's charge: its demand as fixed, less the claims by name another pod
        pays for (those it pays are recorded as its), on the model its allocated claims got."""
        if charge is None or demand is None or demand.claims is None:
            return charge
        count = charge.count
        for key, units in demand.claims.named:
            if self.payer(key, pod.uid) is not None:
                count -= units
                continue
            self._payers[key] = pod.uid
            if self._expected.get(key, ("", ""))[1] == pod.uid:
                del self._expected[key]  # seen: the cache's own record takes over
        card = self._allocated_card(pod, charge, demand)
        if count == charge.count and card == charge.card:
            return charge
        return replace(charge, count=count, card=card) if count > 0 else None

    def _allocated_card(self, pod: PodRecord, charge: Charge, demand: PodDemand) -> CardName | None:
        """The model a pod's allocated claims got: the one it is counted on (its ``A|B`` choice made
        by the scheduler, or another model than it was charged for, which is also recorded). Devices
        of several models are all counted on the one its allocation was read on (``claims_given``),
        the claims of the others recorded."""
        namespace = pod.template.namespace or pod.namespace
        keys = [
            f"{namespace}/{ref.claim or ref.generated}"
            for ref in pod.template.claims
            if ref.claim or ref.generated
        ]
        models: dict[str, frozenset[CardName]] = {}
        for key in keys:
            self.off_model.pop(key, None)
            claim = self._devices.claims.get(key)
            if claim is not None and claim.allocated:
                models[key] = self._devices.allocated(claim)
        found = frozenset().union(*models.values())
        if len(found) > 1:
            read = demand.claims.spec.cards if demand.claims is not None else ()
            card = read[0] if len(read) == 1 and read[0] in found else charge.card
            for key, held in models.items():
                for other in sorted(held - {card}):
                    self.off_model[key] = (pod.key, charge.spec.text, other, card)
            return card
        if not found:
            return charge.card
        (card,) = found
        if card not in charge.spec.cards and (charge.card is None or card != charge.card):
            for key in keys:
                self.off_model[key] = (pod.key, charge.spec.text, card, card)
        return card
