"""Which namespaces may use a queue: a Queue's ``cardquota.volcano.sh/namespaces`` annotation, a
label selector over Namespaces in the syntax of ``kubectl get -l`` (Kubernetes' ``labels.Parse``),
as Kueue's ClusterQueue ``namespaceSelector`` says it: requirements separated by commas, each
``key``, ``!key``, ``key=value`` (or ``==``), ``key!=value``, ``key in (a,b)`` or ``key notin (a,b)``.
Every Namespace carries ``kubernetes.io/metadata.name``, so ``kubernetes.io/metadata.name in
(team-a,team-b)`` names namespaces outright.
"""

import functools
import re
from collections.abc import Mapping

from webhook.core.model.values import value_class

_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_SET = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")
_EQUALITY = re.compile(r"^([^!=\s]+)\s*(==|=|!=)\s*(.*)$")


class SelectorError(ValueError):
    """A selector that does not parse: the reason, one line."""


@value_class
class Requirement:
    key: str
    op: str  # "exists", "!", "in", "notin"
    values: frozenset[str]

    def holds(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!":
            return self.key not in labels
        if self.op == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # notin: absent passes, as in Kubernetes


@value_class
class Selector:
    text: str
    requirements: tuple[Requirement, ...]

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(r.holds(labels) for r in self.requirements)


def _split(text: str) -> list[str]:
    """The requirements: split at commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError("a ')' closes nothing")
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise SelectorError("a '(' is never closed")
    return [*parts, text[start:]]


def _key(key: str) -> str:
    if len(key) > 317 or not _KEY.match(key) or len(key.rpartition("/")[2]) > 63:
        raise SelectorError(f"{key!r} is not a label key")
    return key


def _value(value: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise SelectorError(f"{value!r} is not a label value")
    return value


def _requirement(part: str) -> Requirement:
    part = part.strip()
    if not part:
        raise SelectorError("an empty requirement (two commas, or one at an end)")
    if found := _SET.match(part):
        key, op, listed = found.groups()
        values = [v.strip() for v in listed.split(",")]
        if not listed.strip() or any(not v for v in values):
            raise SelectorError(f"{part!r}: the set must list values, separated by commas")
        return Requirement(_key(key), op, frozenset(_value(v) for v in values))
    if found := _EQUALITY.match(part):
        key, op, value = found.groups()
        return Requirement(_key(key), "notin" if op == "!=" else "in", frozenset({_value(value.strip())}))
    if part.startswith("!"):
        return Requirement(_key(part[1:].strip()), "!", frozenset())
    return Requirement(_key(part), "exists", frozenset())


@functools.lru_cache(maxsize=1024)
def parse_selector(text: str) -> Selector:
    """The selector ``text`` says; ``SelectorError`` when it does not parse. An empty one is refused
    too: it would select every namespace, which is what no annotation says."""
    if not text.strip():
        raise SelectorError("it is empty (to open the queue to every namespace, remove the annotation)")
    return Selector(text, tuple(_requirement(part) for part in _split(text)))
