"""Every setting of ``cardquota serve`` in one place: a flag, an environment variable, a default.

``--cert-dir`` is also ``CARDQUOTA_CERT_DIR``: flags win over the environment, the environment over
the defaults. docs/operations.md lists them all; ``cardquota serve --help`` prints them. The ones
decisions depend on (``PolicySettings``) are also flags of the offline commands (review, status,
whatif, headroom, examples), so they answer as the server configured alike would.
"""

import argparse
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from webhook.core.model.policy import SENT_RESOURCE_PREFIXES, Policy
from webhook.errors import ConfigError

MiB = 2**20


class PolicySettings(BaseSettings):
    """The settings decisions depend on: ``serve`` and every offline command take them alike."""

    model_config = SettingsConfigDict(env_prefix="CARDQUOTA_", frozen=True, extra="forbid")

    unnamed_card_pods: Literal["deny", "warn"] = Field(
        "deny", description="a pod requesting a card resource without volcano.sh/card.name: deny or warn"
    )
    over_quota: Literal["deny", "wait"] = Field(
        "deny",
        description="a controller's card pod that does not fit now: deny (its controller waits in the "
        "queue's line and is told to retry when its cards free) or wait (admitted under a scheduling "
        "gate, released when they free); a Queue's cardquota.volcano.sh/over-quota annotation overrides it",
    )
    enforcement: Literal["deny", "warn", "audit"] = Field(
        "deny",
        description="whether a quota refuses: deny; warn (admitted, the refusal it would have been in an "
        "admission warning and an Event); audit (admitted, the refusal in the audit log, an Event and a "
        "metric); a Queue's cardquota.volcano.sh/enforcement annotation overrides it",
    )
    waiting_line: bool = Field(
        True,
        description="keep a waiting line per queue (refused controllers are called when their cards free); "
        "off: a refused pod's controller retries on its own back-off",
    )
    reclaim: Literal["on", "dry-run", "off"] = Field(
        "on",
        description="tidal reclaim: an admitted inference pod no node of its model can hold takes the "
        "cards back from whole training gangs of lower-priority reclaimable queues (on), is only "
        "reported (dry-run), or waits (off); a Queue's cardquota.volcano.sh/reclaim annotation overrides it",
    )
    dra_drivers: str = Field(
        "gpu.nvidia.com,hami-core-gpu.project-hami.io",
        description="Dynamic Resource Allocation drivers whose ResourceSlice devices are GPUs counted as "
        "cards, comma-separated; empty: DeviceClasses, ResourceSlices and claims are not watched (a "
        "cluster without resource.k8s.io/v1) and pods' resource claims are not read",
    )
    in_flight_ttl_seconds: float = Field(
        30.0, gt=0, description="how long admitted demand is held before the cache shows it"
    )
    default_resource: str = Field(
        "nvidia.com/gpu", description="resource of a card that is in a quota but on no node yet"
    )
    default_label_key: str = Field(
        "nvidia.com/gpu.product", description="node label for affinity when discovery has none"
    )
    service_type: bool = Field(
        False, description="set volcano.sh/service.type on PodGroups from the owner kind"
    )
    service_types: str = Field(
        "ReplicaSet=inference,Deployment=inference,StatefulSet=inference,Job=training",
        description="with --service-type: PodGroup owner kind=service type, comma-separated "
        "(Job is a batch or a Volcano Job)",
    )
    preemptable: str = Field(
        "inference=false,training=true",
        description="with --service-type: service type=the volcano.sh/preemptable it defaults to",
    )
    hierarchical_queues: bool = Field(
        True, description="a child queue's card use also counts against every ancestor with a card quota"
    )
    cpu_memory_check: bool = Field(
        False,
        description="also count CPU and memory requests of Volcano-scheduled pods against the queue's "
        "spec.capability (a resource it leaves out is 0, as in the capacity-card plugin)",
    )
    card_unlimited_cpu_memory: bool = Field(
        False, description="with --cpu-memory-check: pods that use cards are not charged CPU or memory"
    )
    hami_default_memory_mib: int = Field(
        0,
        ge=0,
        description="HAMi's scheduler.defaultMem: the MiB a HAMi pod that asks no GPU memory is given "
        "and charged (0: the whole card)",
    )
    hami_default_cores: int = Field(
        0,
        ge=0,
        le=100,
        description="HAMi's scheduler.defaultCores: the percent of compute such a pod is given",
    )
    volcano_schedulers: str = Field(
        "volcano",
        description="with --cpu-memory-check: the schedulerNames whose pods it counts, comma-separated",
    )
    sent_resource_prefixes: str = Field(
        ",".join(SENT_RESOURCE_PREFIXES),
        description="the resource prefixes the registered webhooks' filters send (the chart's "
        "webhook.cardResourcePrefixes), comma-separated: a node card resource outside them is warned "
        "of (status, an Event on the node, a metric), since its pods are never checked",
    )

    @field_validator("service_types", "preemptable")
    @classmethod
    def _pairs_parse(cls, text: str, info: ValidationInfo) -> str:
        pairs = _pairs(text)
        if info.field_name == "preemptable" and not set(pairs.values()) <= {"true", "false"}:
            raise ValueError(f"values must be true or false, got {text!r}")
        return text

    def policy(self) -> Policy:
        return Policy(
            default_resource=self.default_resource,
            default_label_key=self.default_label_key,
            unnamed_card_pods=self.unnamed_card_pods,
            service_type=self.service_type,
            service_type_by_kind=MappingProxyType(_pairs(self.service_types)),
            preemptable_by_service_type=MappingProxyType(_pairs(self.preemptable)),
            in_flight_ttl=self.in_flight_ttl_seconds,
            over_quota=self.over_quota,
            enforcement=self.enforcement,
            waiting_line=self.waiting_line,
            reclaim=self.reclaim,
            hierarchical_queues=self.hierarchical_queues,
            cpu_memory_check=self.cpu_memory_check,
            card_unlimited_cpu_memory=self.card_unlimited_cpu_memory,
            hami_default_memory_mib=self.hami_default_memory_mib,
            hami_default_cores=self.hami_default_cores,
            dra_drivers=tuple(filter(None, (d.strip() for d in self.dra_drivers.split(",")))),
            volcano_schedulers=frozenset(
                filter(None, (n.strip() for n in self.volcano_schedulers.split(",")))
            ),
            sent_resource_prefixes=tuple(
                filter(None, (p.strip() for p in self.sent_resource_prefixes.split(",")))
            ),
        )


class ServeSettings(PolicySettings):
    model_config = SettingsConfigDict(env_prefix="CARDQUOTA_", frozen=True, extra="forbid")

    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(8443, ge=1, le=65535, description="HTTPS port")
    cert_dir: Path = Field(
        Path("/etc/cardquota/tls"), description="directory with tls.crt and tls.key (a mounted Secret)"
    )
    client_ca: Path | None = Field(
        None, description="CA file: require API-server client certificates signed by it (off by default)"
    )
    cert_poll_seconds: float = Field(
        10.0, gt=0, description="how often the certificate files are checked for a change"
    )
    cluster: Path | None = Field(
        None, description="serve from this snapshot directory of YAML/JSON objects (no cluster needed)"
    )
    kubeconfig: Path | None = Field(
        None,
        description="serve from the live cluster this kubeconfig reaches (in a pod: its service account)",
    )
    watch_broken_seconds: float = Field(
        60.0, gt=0, description="turn unready when a watch has been broken for longer than this"
    )
    audit_seconds: float = Field(
        30.0, gt=0, description="how often the live cache looks for queues above their quota"
    )
    call_seconds: float = Field(
        0.25, gt=0, le=10, description="how often the serving replica calls the next in the waiting lines"
    )
    reclaim_after_seconds: float = Field(
        1.0,
        ge=0,
        le=60,
        description="how long an admitted pod goes with no card of its model free on any node before "
        "the serving replica takes cards back for it",
    )
    leader_elect: bool = Field(False, description="several replicas: only the holder of a Lease serves")
    label_leader_pod: bool = Field(
        False,
        description="with --leader-elect: every synced replica is ready, and the Lease holder labels its "
        "own pod cardquota.volcano.sh/serving=true for the Service to select (POD_NAME, POD_NAMESPACE)",
    )
    lease_name: str = Field("card-quota-webhook", description="the Lease replicas elect a leader with")
    lease_duration_seconds: int = Field(
        2, ge=1, le=60, description="a standby takes the Lease after seeing it unrenewed this long"
    )
    lease_renew_deadline_seconds: float = Field(
        1.5, gt=0, description="the holder stops deciding when it has not renewed for this long"
    )
    lease_retry_seconds: float = Field(
        0.25, gt=0, description="how often the holder renews the Lease and the standbys read it"
    )
    advertise_address: str = Field(
        "",
        description="host:port the other replicas forward reviews to while this one leads "
        "(default: POD_IP, else 127.0.0.1, and --port)",
    )
    forward_ca: Path | None = Field(
        None,
        description="CA of the other replicas' serving certificates (default: ca.crt beside tls.crt)",
    )
    forward_wait_seconds: float = Field(
        4.0,
        gt=0,
        description="how long a review waits for a leader to forward it to (below timeoutSeconds)",
    )
    lease_namespace: str = Field(
        "", description="namespace of the Lease (default: the pod's namespace, else default)"
    )
    max_body_bytes: int = Field(
        7 * MiB, ge=1024, description="largest AdmissionReview accepted (an UPDATE carries two objects)"
    )
    keepalive_seconds: float = Field(
        120.0, gt=0, description="idle keep-alive; longer than the API server's 90 s idle timeout"
    )
    drain_seconds: float = Field(
        15.0, ge=0, description="after SIGTERM: unready but still serving for this long, then close"
    )
    shutdown_timeout_seconds: float = Field(
        5.0, ge=0, description="after the drain: how long in-flight requests may take to finish"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")

    @model_validator(mode="after")
    def _lease_timings(self) -> "ServeSettings":
        if not self.lease_retry_seconds < self.lease_renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                "lease timings must satisfy retry < renew deadline < duration, got"
                f" {self.lease_retry_seconds:g} / {self.lease_renew_deadline_seconds:g}"
                f" / {self.lease_duration_seconds} s"
            )
        return self

    uvloop: bool = Field(True, description="run on uvloop (faster event loop) when it is installed")


def _pairs(text: str) -> dict[str, str]:
    """``"a=b,c=d"`` as a dict; every entry needs a non-empty key and value."""
    pairs: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (half.strip() for half in entry.partition("="))
        if not sep or not key or not value:
            raise ValueError(f"expected key=value entries separated by commas, got {entry!r}")
        pairs[key] = value
    return pairs


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, model: type[PolicySettings] = ServeSettings
) -> None:
    """One ``--flag`` per setting; unset flags stay None so the environment and defaults apply."""
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        env = f"CARDQUOTA_{name.upper()}"
        help_text = f"{field.description} (env {env}, default {field.default})"
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text)


S = TypeVar("S", bound=PolicySettings)


def load(args: argparse.Namespace) -> ServeSettings:
    return _load(args, ServeSettings)


def load_policy(args: argparse.Namespace) -> Policy:
    """The policy the offline commands' flags (``add_flags(..., PolicySettings)``) describe."""
    return _load(args, PolicySettings).policy()


def _load(args: argparse.Namespace, model: type[S]) -> S:
    given: dict[str, Any] = {
        name: value for name in model.model_fields if (value := getattr(args, name, None)) is not None
    }
    try:
        return model(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "settings"
        raise ConfigError(f"setting {where}: {first.get('msg')}") from exc
