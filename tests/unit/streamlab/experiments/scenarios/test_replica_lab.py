"""The private replica lab's settings (no processes started)."""

from __future__ import annotations

from streamlab.experiments.scenarios.replica_lab import behaviour


def test_a_private_lab_takes_the_labs_behaviour_but_not_its_wiring() -> None:
    """The bug: a lab started from a shell with STREAMLAB_ENGINE_METRICS_PORT set
    records it in its engine settings; the private lab's engine inherited it and
    could not bind (the running lab's engine holds that port)."""
    engine = {"STREAMLAB_ENGINE_METRICS_PORT": "9910", "STREAMLAB_ENGINE_PORT": "9909",
              "STREAMLAB_ENGINE_KEEPALIVE_S": "2"}
    gateway = {"STREAMLAB_GATEWAY_PORT": "9908", "STREAMLAB_GATEWAY_HOST": "127.0.0.1",
               "STREAMLAB_GATEWAY_ENGINE_TARGET": "127.0.0.1:9905",
               "STREAMLAB_GATEWAY_RESUME_STORE": "memory",
               "STREAMLAB_GATEWAY_REDIS_URL": "redis://127.0.0.1:9912/0",
               "STREAMLAB_GATEWAY_HEARTBEAT_S": "0.5"}
    assert behaviour(engine) == {"STREAMLAB_ENGINE_KEEPALIVE_S": "2"}
    assert behaviour(gateway) == {"STREAMLAB_GATEWAY_HEARTBEAT_S": "0.5"}
