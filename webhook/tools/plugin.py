"""kubectl cardquota: the card quota of the cluster kubectl points at, the way kubectl users expect.

Installed as the ``kubectl-cardquota`` executable, so kubectl finds it as a plugin. It reads the
same kubeconfig kubectl does (``--kubeconfig``, else ``KUBECONFIG``, else ``~/.kube/config``), uses
its current context unless ``--context`` names another, and the context's namespace unless
``-n/--namespace`` says otherwise. Everything is read once (list, no watch) and nothing is written.

Exit codes:
  0  answered (whatif: every object would be admitted)
  1  whatif: at least one object would be denied
  2  bad usage or an unanswerable question (no such file, workload, context or kubeconfig)
  3  the cluster did not answer in time
"""

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from webhook import main as main_module
from webhook import settings
from webhook.core.decide.report import cluster_status, lines, lines_table, status_table
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.errors import CardquotaError, ConfigError, NotReady
from webhook.tools import audit, headroom, whatif

EXAMPLES = """examples:
  # every card model and every queue's quota and use, in the current context
  kubectl cardquota status

  # the same from another context, as YAML
  kubectl cardquota status --context gpu-prod -o yaml

  # what the webhooks would say to a manifest, without applying it (exit 1 if any is denied)
  kubectl cardquota whatif -f deploy.yaml -n team-a

  # how many more replicas of a Deployment fit now, and what stops one more
  kubectl cardquota headroom deployment/chat -n team-a

  # ... of a workload not created yet: 2 cards of either model per pod in queue inference
  kubectl cardquota headroom --queue inference --card 'NVIDIA-H200|NVIDIA-H800' --per-pod 2

  # who waits for cards, in each queue's order (workloads refused until their cards free)
  kubectl cardquota waiting
"""

Output = Callable[[Any], str]


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", help="kubeconfig file(s) (default: $KUBECONFIG, ~/.kube/config)")
    common.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    common.add_argument(
        "-n", "--namespace", help="the namespace of names without one (default: the context's, else default)"
    )
    common.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    common.add_argument(
        "--request-timeout", type=float, default=60.0, help="seconds to wait for the cluster (default 60)"
    )
    policy = common.add_argument_group("the webhook's settings (give the installed webhook's own)")
    settings.add_flags(policy, settings.PolicySettings)
    parser = argparse.ArgumentParser(
        prog="kubectl cardquota",
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES + "\n" + __doc__[__doc__.index("Exit codes:") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="status|audit|whatif|headroom|waiting")
    raw = argparse.RawDescriptionHelpFormatter
    for name, text in (
        ("status", "card models and every queue's quota and use"),
        ("audit", "what enforcement would refuse now, and what its modes admitted that it would refuse"),
        ("whatif", "what the webhooks would say to a manifest"),
        ("headroom", "how many more replicas fit now, and what stops one more"),
        ("waiting", "every queue's waiting line in order (-n: only that namespace's waiters)"),
    ):
        sub.add_parser(
            name, parents=[common], help=text, description=text, epilog=EXAMPLES, formatter_class=raw
        )
    what, room = sub.choices["whatif"], sub.choices["headroom"]
    what.add_argument("-f", "--filename", required=True, help="a YAML/JSON manifest, - for stdin")
    room.add_argument("workload", nargs="?", help="deployment|statefulset|replicaset|vcjob/NAME")
    room.add_argument("--queue", help="for a workload not created yet: its queue")
    room.add_argument("--card", help="... its card spec, e.g. NVIDIA-H200 or 'A|B'")
    room.add_argument("--per-pod", type=int, default=1, help="... cards per pod")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
        namespace = args.namespace or context_namespace(kubeconfig, args.context)
        state = main_module.live_state(
            kubeconfig, settings.load_policy(args), args.request_timeout, context=args.context
        )
        if args.command == "status":
            return _print(args.output, cluster_status(state, time.time()), status_table)
        if args.command == "whatif":
            return _whatif(args, state, namespace)
        if args.command == "audit":
            events = main_module.live_events(
                kubeconfig, keys.WOULD_REFUSE_REASON, args.request_timeout, context=args.context
            )
            return _print(args.output, audit.report(state, time.time(), events), audit.table)
        if args.command == "waiting":
            return _print(args.output, lines(state, args.namespace or ""), lines_table)
        return _headroom(args, state, namespace)
    except NotReady as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except CardquotaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def context_namespace(kubeconfig: str, context: str | None) -> str:
    """The namespace the kubeconfig's context (the current one unless named) sets, else default."""
    from kubernetes_asyncio.config import ConfigException, list_kube_config_contexts

    paths = [p for p in kubeconfig.split(os.pathsep) if p]
    if not any(Path(p).expanduser().is_file() for p in paths):
        raise ConfigError(f"no kubeconfig file at {kubeconfig} (set KUBECONFIG or --kubeconfig)")
    try:
        contexts, current = list_kube_config_contexts(kubeconfig)
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
        if chosen is None:
            raise ConfigError(f'context "{context}" is not in kubeconfig {kubeconfig}')
        namespace = (chosen.get("context") or {}).get("namespace") or "default"
    except ConfigError:
        raise
    except ConfigException as exc:
        raise ConfigError(f"cannot read kubeconfig {kubeconfig}: {exc}") from exc
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read kubeconfig {kubeconfig}: {type(exc).__name__}: {exc}") from exc
    except (AssertionError, TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:
        # the client library reads the document without checking its shape first
        raise ConfigError(f"cannot read kubeconfig {kubeconfig}: not a kubeconfig ({exc!r})") from exc
    return str(namespace)


def _whatif(args: argparse.Namespace, state: ClusterState, namespace: str) -> int:
    filename = args.filename
    objects = whatif.read_manifest(filename, sys.stdin.buffer.read() if filename == "-" else None)
    objects = [(source, _in_namespace(obj, namespace)) for source, obj in objects]
    answers = whatif.whatif(state, objects)
    _print(args.output, [a.as_json() for a in answers], lambda _: whatif.table(answers))
    return 0 if all(a.allowed for a in answers) else 1


def _in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    meta = obj.get("metadata")
    if obj.get("kind") == "Queue" or not isinstance(meta, dict) or meta.get("namespace"):
        return obj
    return {**obj, "metadata": {**meta, "namespace": namespace}}


def _headroom(args: argparse.Namespace, state: ClusterState, namespace: str) -> int:
    if bool(args.workload) == bool(args.queue and args.card):
        raise ConfigError("name a workload (KIND/NAME), or give --queue and --card for a new one")
    now = time.time()
    if args.workload:
        kind, _, name = args.workload.partition("/")
        if not name or "/" in name:
            raise ConfigError(f"expected KIND/NAME (e.g. deployment/chat), got {args.workload!r}")
        answers = headroom.of_ref(state, f"{kind}/{namespace}/{name}", now)
    else:
        answers = [headroom.of_new(state, args.queue, args.card, args.per_pod, now)]
    return _print(args.output, [a.as_json() for a in answers], lambda _: headroom.tables(answers))


def _print(output: str, data: Any, table: Output) -> int:
    if output == "json":
        sys.stdout.buffer.write(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    elif output == "yaml":
        sys.stdout.write(yaml.safe_dump(orjson.loads(orjson.dumps(data)), sort_keys=False))
    else:
        print(table(data))
    return 0
