"""Register a webhook served outside the cluster (by URL): the chart's own webhook configurations,
as ``helm template`` renders them in URL mode, never a copy written here."""

import base64
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.build import ensure_binaries

CHART = Path(__file__).resolve().parents[2] / "charts" / "card-quota-webhook"
RELEASE_NAMESPACE = "card-quota"  # what the chart's configurations exclude besides the system ones
WEBHOOK_USER = "cardquota-admin"  # the user of the control plane's kubeconfig, the webhook's too


def render(
    flags: Sequence[str], templates: Sequence[str] = ("templates/webhooks.yaml",)
) -> list[dict[str, Any]]:
    """The chart's ``templates`` as ``helm template`` renders them with ``flags``."""
    shown = [arg for template in templates for arg in ("--show-only", template)]
    args = ["template", "cq", str(CHART), "-n", RELEASE_NAMESPACE, *shown, *flags]
    done = subprocess.run(
        [str(ensure_binaries() / "helm"), *args], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def configurations(
    url: str,
    ca: Path,
    selector: dict[str, str] | None,
    prefix: str = "cardquota",
    identity: str = WEBHOOK_USER,
    values: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The chart's validating and mutating configurations pointing at ``url`` (``/validate``,
    ``/mutate``), for namespaces labelled ``selector`` (or every namespace but the system ones),
    named after ``prefix``. ``identity``: the user the webhook writes as, whose own writes are never
    sent; ``values``: more ``--set`` values of the chart (e.g. ``cpuMemoryCheck.enabled=true``)."""
    flags = [
        "--set",
        f"webhook.url={url}",
        "--set",
        "certs.mode=provided",
        "--set",
        "certs.secretName=unused",  # provided mode's Secret: the server outside reads its own files
        "--set",
        f"certs.caBundle={base64.b64encode(ca.read_bytes()).decode()}",
        "--set",
        f"webhook.username={identity}",
    ]
    for key, value in (selector or {}).items():
        flags += ["--set-string", f"webhook.namespaceLabels.{key.replace('.', chr(92) + '.')}={value}"]
    for value in values:
        flags += ["--set", value]
    rendered = render(flags)
    for config in rendered:
        kind = "validate" if config["kind"] == "ValidatingWebhookConfiguration" else "mutate"
        config["metadata"] = {"name": f"{prefix}-{kind}"}
    return rendered
