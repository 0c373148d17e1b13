"""`pagedserve serve` flag handling and the command lines it launches (nothing is started)."""

from __future__ import annotations

import socket
import sys

import pytest

from pagedserve.services.cli import build_parser
from pagedserve.services.cli.launch_plan import Ports, ServeOptions, plan_launch
from pagedserve.services.cli.serve import options_from_args, pick_ports
from tests.unit.compose.compose_files import parse_service_args

PORTS = Ports(redis=7001, plan=7002, result=7003, master=7004)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    for name in ("PORT", "REDIS_URL", "MODEL", "API_KEY", "TENSOR_PARALLEL_SIZE", "BLOCK_SIZE",
                 "MAX_NUM_BATCHED_TOKENS"):  # fmt: skip
        monkeypatch.delenv(f"PAGEDSERVE_{name}", raising=False)


def parse(*argv: str) -> ServeOptions:
    return options_from_args(build_parser().parse_args(["serve", *argv]))


def test_no_arguments_serves_the_default_model_on_8000_with_a_private_redis() -> None:
    options = parse()
    assert (options.model, options.port, options.host) == ("smollm2", 8000, "127.0.0.1")
    assert options.tensor_parallel_size == options.num_gateways == 1
    assert options.redis_url is None
    assert options.engine_id.startswith("engine-")


def test_environment_supplies_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://10.0.0.5:6379/2")
    monkeypatch.setenv("PAGEDSERVE_PORT", "9100")
    monkeypatch.setenv("PAGEDSERVE_BLOCK_SIZE", "32")
    monkeypatch.setenv("PAGEDSERVE_MAX_NUM_BATCHED_TOKENS", "1024")
    options = parse()
    assert options.redis_url == "redis://10.0.0.5:6379/2" and options.port == 9100
    assert options.block_size == 32 and options.max_num_batched_tokens == 1024
    assert parse("--port", "9200").port == 9200  # the flag wins


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be >= 1, got 0"),
        (["--num-gateways", "0"], "--num-gateways must be >= 1, got 0"),
        (["--port", "65535", "--num-gateways", "2"], "in 1..65535, got 65535..65536"),
        (["--block-size", "12"], "block-size must be a power of two >= 1, got 12"),
        (["--gpu-memory-utilization", "1.5"], "gpu-memory-utilization must be in (0, 1], got 1.5"),
        (["--shutdown-timeout", "-1"], "--shutdown-timeout must be >= 0, got -1"),
        (["--max-num-seqs", "0"], "max-num-seqs must be >= 1, got 0"),
        (["--max-num-batched-tokens", "0"], "max-num-batched-tokens must be >= 1, got 0"),
        (["--kv-cache-memory", "0"], "--kv-cache-memory must be >= 1 byte, got 0"),
        (["--api-key", ""], "--api-key must not be empty"),
        (["--engine-loss-timeout", "0"], "--engine-loss-timeout must be > 0, got 0.0"),
        (["--finished-request-ttl", "0"], "--finished-request-ttl must be >= 1, got 0"),
        (["--async-scheduling", "-tp", "2"], "--async-scheduling needs --tensor-parallel-size 1"),
    ],
)
def test_bad_values_name_the_flag_and_the_bound(argv, message) -> None:
    with pytest.raises(ValueError) as error:
        parse(*argv)
    assert message in str(error.value)


def test_bad_values_exit_2_with_the_message(capsys) -> None:
    args = build_parser().parse_args(["serve", "--num-gateways", "0"])
    with pytest.raises(SystemExit) as exited:
        args.func(args)
    assert exited.value.code == 2
    assert "--num-gateways must be >= 1, got 0" in capsys.readouterr().err


def test_a_taken_gateway_port_is_refused_before_anything_starts() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=rf"port {port} on 127.0.0.1 is in use"):
            pick_ports(parse("--port", str(port)))


def test_engine_ports_are_free_and_distinct() -> None:
    ports = pick_ports(parse("--port", "18555"))
    assert len({ports.redis, ports.plan, ports.result, ports.master}) == 4


def test_plan_one_worker_per_rank_sharing_the_scheduler_ports() -> None:
    options = parse("--tensor-parallel-size", "2", "--max-model-len", "512",
                    "--no-enable-prefix-caching", "--scheduling-policy", "priority")  # fmt: skip
    plan = plan_launch(options, "/models/m", "redis://127.0.0.1:7001/0", PORTS)
    assert [c.name for c in plan.engine] == ["scheduler", "worker0", "worker1"]
    assert [c.ready_line for c in plan.engine] == [
        "scheduler ready", "worker 0 ready", "worker 1 ready"
    ]  # fmt: skip
    # -P: the child's working directory never stands first on its sys.path
    assert plan.engine[0].argv[:4] == [sys.executable, "-P", "-m", "pagedserve.services.scheduler"]
    scheduler = parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {})
    assert (scheduler.plan_port, scheduler.result_port) == (7002, 7003)
    assert scheduler.tensor_parallel_size == 2 and scheduler.max_model_len == 512
    assert scheduler.no_prefix_caching and scheduler.policy == "priority"
    assert scheduler.engine_id == options.engine_id
    for rank, spec in enumerate(plan.engine[1:]):
        worker = parse_service_args("pagedserve.services.gpu_worker", spec.argv[4:], {})
        assert (worker.rank, worker.tensor_parallel_size) == (rank, 2)
        assert (worker.plan_port, worker.result_port, worker.master_port) == (7002, 7003, 7004)
        assert worker.model == "/models/m" and worker.max_model_len == 512


def test_without_a_block_size_the_workers_pick_it_and_the_scheduler_adopts_it() -> None:
    plan = plan_launch(parse(), "/models/m", "redis://127.0.0.1:7001/0", PORTS)
    for spec in plan.engine:
        assert "--block-size" not in spec.argv
    scheduler = parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {})
    worker = parse_service_args("pagedserve.services.gpu_worker", plan.engine[1].argv[4:], {})
    assert scheduler.block_size is None and worker.block_size is None


def test_without_a_token_budget_the_workers_pick_it_and_the_scheduler_adopts_it() -> None:
    plan = plan_launch(parse(), "/models/m", "redis://127.0.0.1:7001/0", PORTS)
    for spec in plan.engine:
        assert "--max-num-batched-tokens" not in spec.argv
    scheduler = parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {})
    worker = parse_service_args("pagedserve.services.gpu_worker", plan.engine[1].argv[4:], {})
    assert scheduler.max_num_batched_tokens is None and worker.max_num_batched_tokens is None


def test_an_explicit_token_budget_reaches_the_scheduler_and_every_worker() -> None:
    options = parse("--tensor-parallel-size", "2", "--max-num-batched-tokens", "1024")
    plan = plan_launch(options, "/models/m", "redis://127.0.0.1:7001/0", PORTS)
    configs = [
        parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {}),
        *(
            parse_service_args("pagedserve.services.gpu_worker", s.argv[4:], {})
            for s in plan.engine[1:]
        ),
    ]
    assert [c.max_num_batched_tokens for c in configs] == [1024, 1024, 1024]


@pytest.mark.parametrize(
    ("argv", "want"),
    [((), (False, 0.01)), (("--kv-cache-metrics",), (True, 0.01)),
     (("--kv-cache-metrics", "--kv-cache-metrics-sample", "0.5"), (True, 0.5))],
)  # fmt: skip
def test_the_kv_cache_metrics_flags_reach_the_scheduler(argv, want) -> None:
    plan = plan_launch(parse(*argv), "/models/m", "redis://127.0.0.1:7001/0", PORTS)
    args = parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {})
    assert (args.kv_cache_metrics, args.kv_cache_metrics_sample) == want


@pytest.mark.parametrize("argv", [(), ("--async-scheduling",)])
def test_async_scheduling_reaches_the_scheduler(argv) -> None:
    plan = plan_launch(parse(*argv), "/models/m", "redis://127.0.0.1:7001/0", PORTS)
    args = parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {})
    assert args.async_scheduling is bool(argv)


def test_a_kv_cache_metrics_sample_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"kv-cache-metrics-sample must be in \[0, 1\], got 2\.0"):
        parse("--kv-cache-metrics", "--kv-cache-metrics-sample", "2")


def test_an_explicit_block_size_reaches_the_scheduler_and_every_worker() -> None:
    options = parse("--tensor-parallel-size", "2", "--block-size", "32")
    plan = plan_launch(options, "/models/m", "redis://127.0.0.1:7001/0", PORTS)
    scheduler = parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {})
    workers = [
        parse_service_args("pagedserve.services.gpu_worker", spec.argv[4:], {})
        for spec in plan.engine[1:]
    ]
    assert [c.block_size for c in (scheduler, *workers)] == [32, 32, 32]


def test_plan_gateway_replicas_on_consecutive_ports_with_their_own_ids() -> None:
    options = parse("--num-gateways", "3", "--port", "9000", "--served-model-name", "tiny",
                    "--api-key", "sk-secret", "--shutdown-timeout", "7")  # fmt: skip
    plan = plan_launch(options, "/models/m", "redis://127.0.0.1:7001/0", PORTS)
    configs = [
        parse_service_args(
            "pagedserve.services.gateway", spec.argv[4:], {"PAGEDSERVE_API_KEY": None}
        )
        for spec in plan.gateways
    ]
    assert [c.port for c in configs] == [9000, 9001, 9002]
    assert len({c.gateway_id for c in configs}) == 3
    assert {c.served_model_name for c in configs} == {"tiny"}
    assert {c.shutdown_timeout for c in configs} == {7.0}
    assert {c.redis_url for c in configs} == {"redis://127.0.0.1:7001/0"}
    for spec in plan.gateways:  # the key travels in the environment, not on the command line
        assert "sk-secret" not in spec.argv
        assert spec.env is not None and spec.env["PAGEDSERVE_API_KEY"] == "sk-secret"
    assert [s.name for s in plan.gateways] == ["gateway0", "gateway1", "gateway2"]


def test_no_api_key_means_none_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_API_KEY", "leaked")
    plan = plan_launch(ServeOptions(), "/m", "redis://x:1/0", PORTS)
    assert "PAGEDSERVE_API_KEY" not in plan.gateways[0].env


def test_children_wait_for_a_restarted_engine_longer_than_their_own_defaults() -> None:
    """serve restarts a dead engine process, so open requests are kept for 120 s (a worker's
    restart reloads torch and the model) instead of the services' own 30 s / 60 s."""
    for argv, wait_s in (((), 120.0), (("--engine-loss-timeout", "45",
                                         "--worker-recovery-timeout", "50"), None)):  # fmt: skip
        plan = plan_launch(parse(*argv), "/m", "redis://127.0.0.1:7001/0", PORTS)
        scheduler = parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {})
        gateway = parse_service_args("pagedserve.services.gateway", plan.gateways[0].argv[4:], {})
        expected = (wait_s, wait_s) if wait_s else (50.0, 45.0)
        assert (scheduler.worker_recovery_timeout, gateway.engine_loss_timeout) == expected


def test_the_finished_request_ttl_reaches_the_scheduler() -> None:
    for argv, ttl in (((), 600), (("--finished-request-ttl", "45"), 45)):
        plan = plan_launch(parse(*argv), "/m", "redis://127.0.0.1:7001/0", PORTS)
        scheduler = parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {})
        assert scheduler.finished_request_ttl == ttl


def test_a_restarted_gateway_takes_a_new_id_on_the_same_port() -> None:
    from pagedserve.services.cli.launch_plan import gateway_spec

    options = parse("--num-gateways", "2", "--port", "9000")
    first, again = (gateway_spec(options, "/m", "redis://x:1/0", 9001, 1, g) for g in (0, 2))
    ids = [
        parse_service_args("pagedserve.services.gateway", s.argv[4:], {}).gateway_id
        for s in (first, again)
    ]
    assert ids == [f"{options.engine_id}-gateway1", f"{options.engine_id}-gateway1-r2"]
    assert parse_service_args("pagedserve.services.gateway", again.argv[4:], {}).port == 9001


def test_the_step_timeout_and_gateway_limits_reach_their_children() -> None:
    argv = ("--step-timeout", "90", "--max-body-bytes", "1000", "--header-timeout", "3",
            "--body-timeout", "4", "--max-seqs-per-request", "8",
            "--max-requests-per-client", "16", "--tokenizer-threads", "1")  # fmt: skip
    plan = plan_launch(parse(*argv), "/m", "redis://127.0.0.1:7001/0", PORTS)
    scheduler = parse_service_args("pagedserve.services.scheduler", plan.engine[0].argv[4:], {})
    gateway = parse_service_args("pagedserve.services.gateway", plan.gateways[0].argv[4:], {})
    assert scheduler.step_timeout == 90.0
    limits = (gateway.max_body_bytes, gateway.header_timeout, gateway.body_timeout,
              gateway.max_seqs_per_request, gateway.max_requests_per_client,
              gateway.tokenizer_threads)  # fmt: skip
    assert limits == (1000, 3.0, 4.0, 8, 16, 1)


def test_the_tool_call_flags_reach_the_gateways(tmp_path) -> None:
    template = tmp_path / "tools.jinja"
    template.write_text("{{ tools }}{{ messages }}")
    argv = ("--chat-template", str(template), "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes")  # fmt: skip
    plan = plan_launch(parse(*argv), "/m", "redis://127.0.0.1:7001/0", PORTS)
    gateway = parse_service_args("pagedserve.services.gateway", plan.gateways[0].argv[4:], {})
    assert (gateway.chat_template, gateway.enable_auto_tool_choice, gateway.tool_call_parser) == (
        str(template),
        True,
        "hermes",
    )
    plain = plan_launch(parse(), "/m", "redis://127.0.0.1:7001/0", PORTS)
    gateway = parse_service_args("pagedserve.services.gateway", plain.gateways[0].argv[4:], {})
    assert (gateway.chat_template, gateway.enable_auto_tool_choice) == (None, False)
