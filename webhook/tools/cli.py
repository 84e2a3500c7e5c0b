"""``cardquota``: review AdmissionReviews and show queue status offline, from a cluster snapshot.

Contract (other tools rely on it):
  cardquota serve [--cluster DIR] [--cert-dir DIR] ...          the HTTPS webhook (see --help)
  cardquota dev-certs DIR [--name NAME ...]                     development CA and serving cert
  cardquota review --cluster DIR [--webhook validate|mutate]   AdmissionReview on stdin -> response
  cardquota status --cluster DIR | --kubeconfig PATH [--output table|json]
  cardquota examples DIR                                       every review under DIR/reviews
  cardquota probe [--kubeconfig PATH] [--timeout SECONDS]      the webhook answers via the API server?
  cardquota whatif -f FILE --cluster DIR | --kubeconfig PATH [--output table|json]
                                                               what the webhooks would say to FILE
  cardquota headroom KIND/NS/NAME | --queue Q --card SPEC --per-pod N  --cluster DIR | --kubeconfig PATH
                                                               how many more replicas fit now
Exit 0 whenever a response was produced (allowed or not); 2 with a message when it was not;
probe: 0 when the webhook answered, 1 when it did not in time.
"""

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from webhook import main as main_module
from webhook import settings
from webhook.cluster import snapshot
from webhook.core.decide.report import cluster_status, status_table
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.policy import Policy
from webhook.errors import CardquotaError, ConfigError
from webhook.serve import probe, review
from webhook.tools import audit, devcerts, headroom, whatif


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cardquota", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rev = sub.add_parser("review", help="answer one AdmissionReview read from stdin")
    rev.add_argument("--cluster", required=True, type=Path, help="snapshot directory of YAML/JSON")
    rev.add_argument("--webhook", choices=("validate", "mutate"), default="validate")
    settings.add_flags(rev, settings.PolicySettings)
    _state_flags(sub.add_parser("status", help="cluster cards and per-queue usage"))
    _state_flags(
        sub.add_parser("audit", help="what enforcement would refuse now: queues past their quota, workloads")
    )
    ex = sub.add_parser("examples", help="review every file in DIR/reviews against DIR/cluster")
    ex.add_argument("directory", type=Path)
    serve = sub.add_parser("serve", help="serve /validate and /mutate over HTTPS")
    settings.add_flags(serve)
    what = sub.add_parser("whatif", help="what the webhooks would say to every object of a manifest")
    what.add_argument("-f", "--filename", required=True, help="a YAML/JSON manifest, - for stdin")
    _state_flags(what)
    room = sub.add_parser(
        "headroom", help="how many more replicas of a workload fit now, and what stops one more"
    )
    room.add_argument("workload", nargs="?", help=f"{headroom.REF} (vcjob: one answer per card task)")
    room.add_argument("--queue", help="for a workload not created yet: its queue")
    room.add_argument("--card", help="... its card spec, e.g. NVIDIA-H200 or A|B")
    room.add_argument("--per-pod", type=int, default=1, help="... cards per pod")
    _state_flags(room)
    probe_cmd = sub.add_parser(
        "probe", help="wait until the webhook answers a dry-run review sent through the API server"
    )
    probe_cmd.add_argument("--kubeconfig", type=Path, help="default: the pod's service account")
    probe_cmd.add_argument("--timeout", type=float, default=60.0, help="seconds to keep trying")
    certs = sub.add_parser("dev-certs", help="write a development CA and serving certificate to DIR")
    certs.add_argument("directory", type=Path)
    certs.add_argument(
        "--name", action="append", help="IP or DNS name of the serving certificate (repeatable)"
    )
    return parser


def _state_flags(command: argparse.ArgumentParser) -> None:
    """Where the state comes from (a snapshot or a live cluster), and the output format."""
    where = command.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", type=Path, help="a snapshot directory")
    where.add_argument("--kubeconfig", type=Path, help="the live cluster this kubeconfig reaches")
    command.add_argument("--output", choices=("table", "json"), default="table")
    settings.add_flags(command, settings.PolicySettings)


def _state(args: argparse.Namespace) -> ClusterState:
    policy = settings.load_policy(args)
    if args.cluster is not None:
        return snapshot.load_snapshot(args.cluster, policy)
    return main_module.live_state(args.kubeconfig, policy)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "review":
            return _review(args)
        if args.command == "status":
            return _status(args)
        if args.command == "audit":
            return _audit(args)
        if args.command == "serve":
            return main_module.run(settings.load(args))
        if args.command == "whatif":
            return _whatif(args)
        if args.command == "headroom":
            return _headroom(args)
        if args.command == "probe":
            return _probe(args.kubeconfig, args.timeout)
        if args.command == "dev-certs":
            names = args.name or devcerts.DEFAULT_NAMES
            print(devcerts.ensure_dev_certs(args.directory, names))
            return 0
        return _examples(args.directory)
    except CardquotaError as exc:
        print(f"cardquota: {exc}", file=sys.stderr)
        return 2


def _whatif(args: argparse.Namespace) -> int:
    filename = args.filename
    objects = whatif.read_manifest(filename, sys.stdin.buffer.read() if filename == "-" else None)
    answers = whatif.whatif(_state(args), objects)
    if args.output == "json":
        sys.stdout.buffer.write(whatif.as_json(answers) + b"\n")
    else:
        print(whatif.table(answers))
    return 0


def _headroom(args: argparse.Namespace) -> int:
    if bool(args.workload) == bool(args.queue and args.card):
        raise ConfigError(f"name a workload ({headroom.REF}), or give --queue and --card for a new one")
    state = _state(args)
    now = time.time()
    if args.workload:
        answers = headroom.of_ref(state, args.workload, now)
    else:
        answers = [headroom.of_new(state, args.queue, args.card, args.per_pod, now)]
    if args.output == "json":
        sys.stdout.buffer.write(headroom.as_json(answers) + b"\n")
    else:
        print(headroom.tables(answers))
    return 0


def _probe(kubeconfig: Path | None, timeout: float) -> int:
    try:
        print(f"the webhook answered: {probe.run(kubeconfig, timeout)}")
    except probe.ProbeFailed as exc:
        print(f"cardquota: {exc}", file=sys.stderr)
        return 1
    return 0


def _review(args: argparse.Namespace) -> int:
    state = snapshot.load_snapshot(args.cluster, settings.load_policy(args))
    body = sys.stdin.buffer.read()
    out = review.answer(state, body, args.webhook, time.time())
    sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def _audit(args: argparse.Namespace) -> int:
    events: list[Any] | str = (
        snapshot.load_kind(args.cluster, "Event")
        if args.cluster is not None
        else main_module.live_events(args.kubeconfig, keys.WOULD_REFUSE_REASON)
    )
    found = audit.report(_state(args), time.time(), events)
    if args.output == "json":
        sys.stdout.buffer.write(orjson.dumps(found, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(audit.table(found))
    return 0


def _status(args: argparse.Namespace) -> int:
    status = cluster_status(_state(args), time.time())
    if args.output == "json":
        sys.stdout.buffer.write(orjson.dumps(status, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(status_table(status))
    return 0


def example_files(directory: Path) -> list[tuple[Path, review.Webhook, tuple[str, ...]]]:
    """``*.mutate.json`` go to the mutating webhook, every other ``*.json`` to the validating one;
    a ``NAME.flags`` file beside ``NAME.json`` holds the settings that example is answered with."""
    found = []
    for path in sorted((directory / "reviews").glob("*.json")):
        flags_file = path.with_suffix(".flags")
        flags = tuple(flags_file.read_text().split()) if flags_file.exists() else ()
        found.append((path, "mutate" if path.name.endswith(".mutate.json") else "validate", flags))
    return found  # type: ignore[return-value]


def policy_of(flags: Sequence[str]) -> Policy:
    """The policy a list of setting flags (``--cpu-memory-check`` ...) describes."""
    parser = argparse.ArgumentParser(prog="cardquota", exit_on_error=False)
    settings.add_flags(parser, settings.PolicySettings)
    try:
        return settings.load_policy(parser.parse_args(list(flags)))
    except argparse.ArgumentError as exc:
        raise ConfigError(str(exc)) from exc


def review_example(directory: Path, path: Path, webhook: review.Webhook, flags: Sequence[str] = ()) -> str:
    """Each example is reviewed against a fresh load of the cluster, as if it came alone."""
    state = snapshot.load_snapshot(directory / "cluster", policy_of(flags))
    _, decision = review.decide(state, path.read_bytes(), webhook, time.time())
    return review.summary(decision)


def example_header(path: Path, webhook: str, flags: Sequence[str]) -> str:
    """``# examples/reviews/NAME.json (validate)``, with the example's flags after the webhook."""
    return f"# {path} ({', '.join([webhook, *flags])})" if flags else f"# {path} ({webhook})"


def _examples(directory: Path) -> int:
    for path, webhook, flags in example_files(directory):
        print(example_header(path.relative_to(directory.parent), webhook, flags))
        print(review_example(directory, path, webhook, flags))
        print()
    return 0
