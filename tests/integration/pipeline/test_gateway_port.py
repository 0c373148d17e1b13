"""A gateway whose port another process took between `free_port()` and its bind (an outgoing
connection may take any ephemeral port on a busy box) starts again on another port when the
pipeline waits for it to serve, instead of failing the module's fixture."""

from __future__ import annotations

import socket

import httpx

from tests.integration.pipeline.conftest import (
    PORT_TAKEN,
    add_engine,
    add_gateway,
    wait_until_serving,
)


def test_a_gateway_that_lost_its_port_serves_on_another(pipeline_factory):
    pipeline = pipeline_factory()
    add_engine(pipeline, "eng-port")
    gateway = add_gateway(pipeline, "gw-port")
    taken = pipeline.gateway_ports[0]
    gateway.stop()  # start it again on a port that is taken, as a race would leave it
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        pipeline.gateways[0] = gateway = type(gateway)(
            gateway.name, gateway.module, gateway.args, gateway.env
        ).start()
        gateway.process.wait(timeout=120)  # it cannot bind: it exits
        assert PORT_TAKEN in gateway.log()
        wait_until_serving(pipeline)
    assert pipeline.gateway_ports[0] != taken
    assert pipeline.gateways[0].is_alive() and pipeline.gateways[0] is not gateway
    assert httpx.get(f"{pipeline.base_url()}/health", timeout=10).status_code == 200
