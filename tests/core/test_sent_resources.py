"""What the chart's filters send is derived from what the code counts: the chart's default
``webhook.cardResourcePrefixes`` is the policy's list, and every resource name the code counts
whatever the nodes say starts with one of them (the live filters are evaluated in
tests/e2e/test_filters.py)."""

from pathlib import Path

import pytest
import yaml

from webhook.core.model import keys
from webhook.core.model.claims import IMPLICIT_PREFIX
from webhook.core.model.policy import SENT_RESOURCE_PREFIXES, Policy
from webhook.core.model.sharing import NODE_RESOURCES, POD_RESOURCES

VALUES = Path(__file__).resolve().parents[2] / "charts" / "card-quota-webhook" / "values.yaml"

# Every resource name a pod can ask that the code counts as a card or a share of one, whatever
# the nodes advertise (a node's own vendor resources come from its labels: warned of when unsent).
COUNTED = sorted(
    {
        Policy().default_resource,
        keys.MPS_RESOURCE,
        f"{keys.MIG_PREFIX}1g.10gb",
        f"{IMPLICIT_PREFIX}gpu.example.com",
        *POD_RESOURCES,
        *NODE_RESOURCES,
    }
)


def test_the_charts_default_filter_is_the_policys_list() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert tuple(values["webhook"]["cardResourcePrefixes"]) == SENT_RESOURCE_PREFIXES
    assert Policy().sent_resource_prefixes == SENT_RESOURCE_PREFIXES


@pytest.mark.parametrize("resource", COUNTED)
def test_every_resource_the_code_counts_is_sent(resource: str) -> None:
    assert resource.startswith(SENT_RESOURCE_PREFIXES), f"{resource} would never reach the webhook"


@pytest.mark.parametrize(
    "resource", ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "example.com/fpga"]
)
def test_core_and_unrelated_resources_are_not_sent(resource: str) -> None:
    assert not resource.startswith(SENT_RESOURCE_PREFIXES)
