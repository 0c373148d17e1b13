"""compose/kubernetes rendered as `kubectl kustomize` renders it, and each pagedserve
container's command line and environment as its process would see them."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pagedserve.services.cli import health_probe
from pagedserve.services.gateway import __main__ as gateway_main
from pagedserve.services.gpu_worker import __main__ as worker_main
from pagedserve.services.scheduler import __main__ as scheduler_main
from pagedserve.shared.options import add_options

KUBERNETES_DIR = Path(__file__).resolve().parents[3] / "compose" / "kubernetes"
OVERLAYS = ("cpu", "gpu")
PYTHON_MODULE = ["python", "-P", "-m"]
# Each pagedserve module a container may run, and the parser its process builds.
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "pagedserve.services.scheduler": scheduler_main.build_parser,
    "pagedserve.services.gpu_worker": worker_main.build_parser,
    "pagedserve.services.cli.health_probe": health_probe.build_parser,
}
GATEWAY = "pagedserve.services.gateway"
POD_NAME = "engine-0"  # what a metadata.name field reference stands for in the checks


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl is not on PATH: the manifests cannot be rendered")
    done = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES_DIR / "overlays" / overlay)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay}: {done.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def find(objects: tuple[dict, ...], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


@dataclass(frozen=True)
class Container:
    workload: str  # the Deployment's or StatefulSet's name
    pod_spec: dict[str, Any]
    spec: dict[str, Any]
    env: dict[str, str]  # every variable the process sees (field references resolved)

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def module(self) -> str:
        command = self.spec["command"]
        assert command[:3] == PYTHON_MODULE, f"{self.name}: {command} is not python -P -m"
        return command[3]

    def port(self, name: str) -> int:
        return next(p["containerPort"] for p in self.spec.get("ports", []) if p["name"] == name)


def pagedserve_containers(objects: tuple[dict, ...]) -> list[Container]:
    config_maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    found = []
    for workload in objects:
        if workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod_spec = workload["spec"]["template"]["spec"]
        for spec in pod_spec["containers"]:
            if spec["image"].startswith("pagedserve"):
                env = _environment(spec, config_maps)
                found.append(Container(workload["metadata"]["name"], pod_spec, spec, env))
    return found


def _environment(spec: dict[str, Any], config_maps: dict[str, dict[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]])
    for variable in spec.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        elif "fieldRef" in variable.get("valueFrom", {}):
            assert variable["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[variable["name"]] = POD_NAME
        # an optional secret (the API key) may be absent: not resolved here
    return env


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """Only `env`'s PAGEDSERVE_* variables set, as in the container (argparse reads defaults
    from the environment when the parser is built)."""
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith("PAGEDSERVE_") or n == "REDIS_URL"]:
        del os.environ[name]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse(module: str, argv: list[str], env: dict[str, str]) -> argparse.Namespace | Any:
    """The process's parsed flags under `env` (the gateway's: its GatewayConfig)."""
    with environment(env):
        if module == GATEWAY:
            return gateway_main.parse_args(argv)
        return PARSERS[module]().parse_args(argv)


def dests_read_by(module: str, argv: list[str] | None = None) -> set[str]:
    """The option destinations the module's parser (its subcommand's, for the probe) reads."""
    if module == GATEWAY:
        parser = argparse.ArgumentParser()
        add_options(parser, *gateway_main.GATEWAY_OPTIONS)
    else:
        parser = PARSERS[module]()
    if argv:  # the probe's subcommand
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[argv[0]]
    return {action.dest for action in parser._actions}
