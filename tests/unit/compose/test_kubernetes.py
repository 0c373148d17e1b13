"""compose/kubernetes, offline: both overlays render (`kubectl kustomize`), every object is
valid against the Kubernetes schemas (`kubernetes-validate`, strict: no unknown field), and
what the containers run agrees with the options table: each command is a pagedserve module
whose parser accepts the container's PAGEDSERVE_* variables (each one an option that module
reads), probes go through health_probe, ports and sentinel addresses point where something
listens, and termination leaves time for the drains. No cluster is run."""

from __future__ import annotations

import kubernetes_validate
import pytest

from pagedserve.services.gateway.drain import ABORT_GRACE_S
from pagedserve.shared.options import OPTIONS
from pagedserve.shared.redis_client import SentinelAddress
from tests.unit.compose.kubernetes_render import (
    GATEWAY,
    OVERLAYS,
    PYTHON_MODULE,
    Container,
    dests_read_by,
    find,
    pagedserve_containers,
    parse,
    render,
)

KUBERNETES_VERSION = "1.30.0"  # the oldest release still supported upstream when written
DEST_OF_VARIABLE = {f"PAGEDSERVE_{o.dest.upper()}": o.dest for o in OPTIONS.values()}
PROBE = "pagedserve.services.cli.health_probe"


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return request.param


def containers(overlay: str) -> dict[str, Container]:
    return {f"{c.workload}/{c.name}": c for c in pagedserve_containers(render(overlay))}


def test_every_object_is_valid_against_the_schemas(overlay: str) -> None:
    objects = render(overlay)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["Namespace", "ConfigMap", "ConfigMap", "ConfigMap", "Service",
                            "Service", "Service", "Deployment", "StatefulSet", "StatefulSet",
                            "HorizontalPodAutoscaler", "PodDisruptionBudget",
                            "PodDisruptionBudget", "PodDisruptionBudget"])  # fmt: skip
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_a_wrong_field_is_caught_by_the_validation() -> None:
    deployment = dict(find(render("cpu"), "Deployment", "gateway"))
    deployment["spec"] = {**deployment["spec"], "replica": 2}  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_every_variable_is_an_option_its_process_reads(overlay: str) -> None:
    for key, container in containers(overlay).items():
        reads = dests_read_by(container.module)
        for variable in container.env:
            assert variable in DEST_OF_VARIABLE, f"{key}: {variable} is no option's variable"
            assert DEST_OF_VARIABLE[variable] in reads, (
                f"{key}: {container.module} does not read {variable}"
            )
        parse(container.module, container.spec.get("args", []), container.env)


def test_engine_pods_hold_one_scheduler_and_its_ranks(overlay: str) -> None:
    engine = [c for c in containers(overlay).values() if c.workload == "engine"]
    scheduler = parse(engine[0].module, [], engine[0].env)
    assert engine[0].module == "pagedserve.services.scheduler"
    assert scheduler.engine_id == "engine-0"  # the pod's name
    workers = [parse(c.module, [], c.env) for c in engine[1:]]
    assert {c.module for c in engine[1:]} == {"pagedserve.services.gpu_worker"}
    assert sorted(w.rank for w in workers) == list(range(scheduler.tensor_parallel_size))
    for worker in workers:
        assert worker.tensor_parallel_size == scheduler.tensor_parallel_size
        # the pod's loopback: the scheduler binds its host, the workers connect to it
        assert worker.scheduler_host == scheduler.host == "127.0.0.1"
        assert (worker.plan_port, worker.result_port) == (scheduler.plan_port,
                                                          scheduler.result_port)  # fmt: skip
        assert worker.device == ("cuda" if overlay == "gpu" else "cpu")
    gpus = [c.spec["resources"]["limits"].get("nvidia.com/gpu") for c in engine[1:]]
    assert gpus == ([1] * len(workers) if overlay == "gpu" else [None] * len(workers))


def test_the_sentinel_option_names_the_redis_pods(overlay: str) -> None:
    objects = render(overlay)
    redis = find(objects, "StatefulSet", "redis")
    sentinel = next(c for c in redis["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "sentinel")  # fmt: skip
    sentinel_port = sentinel["ports"][0]["containerPort"]
    service = redis["spec"]["serviceName"]
    expected = {(f"redis-{i}.{service}", sentinel_port) for i in range(redis["spec"]["replicas"])}
    assert find(objects, "Service", service)["spec"]["clusterIP"] == "None"
    for key, container in containers(overlay).items():
        if "PAGEDSERVE_REDIS_SENTINEL" in container.env:
            address = SentinelAddress.parse(container.env["PAGEDSERVE_REDIS_SENTINEL"])
            assert set(address.hosts) == expected, key
            assert address.service_name in sentinel_config(objects)


def sentinel_config(objects: tuple[dict, ...]) -> str:
    return find(objects, "ConfigMap", "redis-config")["data"]["render.sh"]


def test_probes_run_health_probe_on_the_served_port(overlay: str) -> None:
    objects = render(overlay)
    probed = set()
    for key, container in containers(overlay).items():
        for probe in ("readinessProbe", "livenessProbe"):
            if probe not in container.spec:
                continue
            command = container.spec[probe]["exec"]["command"]
            assert command[:4] == [*PYTHON_MODULE, PROBE], key
            argv = command[4:]
            args = parse(PROBE, argv, container.env)
            if args.kind == "gateway":
                served = parse(container.module, [], container.env).port
                assert args.url == f"http://127.0.0.1:{served}/health"
                assert container.port("http") == served
            else:  # the probe looks where its scheduler writes: same Redis, prefix and id
                scheduler = parse(container.module, [], container.env)
                for dest in ("redis_url", "redis_sentinel", "namespace", "engine_id"):
                    assert dest in dests_read_by(PROBE, argv)
                    assert getattr(args, dest) == getattr(scheduler, dest), (key, dest)
            probed.add(container.workload)
    assert probed == {"gateway", "engine"}
    service = find(objects, "Service", "gateway")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert GATEWAY in {c.module for c in containers(overlay).values()}


def test_termination_leaves_time_for_the_drains(overlay: str) -> None:
    by_key = containers(overlay)
    gateway = by_key["gateway/gateway"]
    config = parse(gateway.module, [], gateway.env)
    pre_stop = int(gateway.spec["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = gateway.pod_spec["terminationGracePeriodSeconds"]
    assert grace > pre_stop + config.shutdown_timeout + ABORT_GRACE_S
    scheduler = by_key["engine/scheduler"]
    drain_s = parse(scheduler.module, [], scheduler.env).drain_timeout
    for key, worker in by_key.items():
        if key.startswith("engine/worker"):
            keep_serving = int(worker.spec["lifecycle"]["preStop"]["exec"]["command"][1])
            assert drain_s < keep_serving < worker.pod_spec["terminationGracePeriodSeconds"]


def test_disruption_budgets_and_autoscaler_cover_the_workloads(overlay: str) -> None:
    objects = render(overlay)
    for name in ("redis", "gateway", "engine"):
        budget = find(objects, "PodDisruptionBudget", name)
        labels = budget["spec"]["selector"]["matchLabels"]
        workload = next(o for o in objects if o["kind"] in ("Deployment", "StatefulSet")
                        and o["metadata"]["name"] == name)  # fmt: skip
        assert workload["spec"]["template"]["metadata"]["labels"].items() >= labels.items()
    autoscaler = find(objects, "HorizontalPodAutoscaler", "gateway")
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == "gateway"
    gateway = find(objects, "Deployment", "gateway")["spec"]["template"]["spec"]
    assert gateway["containers"][0]["resources"]["requests"]["cpu"]  # what utilization divides
