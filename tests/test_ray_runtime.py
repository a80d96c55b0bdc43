"""pipeline.cluster.ray_runtime's clean-up checks: whether a lease's release shuts the runtime
down, and whether the cluster's GCS still accepts a connection (Ray itself faked: acquire and
release on a real Ray run in the engine and trainer tests)."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from pipeline.cluster import ray_runtime


@pytest.fixture
def runtime_state(monkeypatch):
    monkeypatch.setattr(ray_runtime, "_state", {"address": None, "started": False})
    monkeypatch.setattr(ray_runtime, "_holders", [])
    return ray_runtime._state, ray_runtime._holders


def test_only_the_last_lease_of_a_runtime_started_here_shuts_it_down(runtime_state):
    state, holders = runtime_state
    engine, trainer = ray_runtime.RayLease("engine=ray"), ray_runtime.RayLease("trainer workers")
    holders.extend([engine, trainer])
    state["started"] = True
    assert not ray_runtime.shuts_down_with(trainer)  # the engine still holds it
    holders.remove(engine)
    assert ray_runtime.shuts_down_with(trainer)
    assert not ray_runtime.shuts_down_with(engine) and not ray_runtime.shuts_down_with(None)
    state.update(address="auto", started=False)  # a joined cluster lives on after the run
    assert not ray_runtime.shuts_down_with(trainer)


@pytest.fixture
def fake_ray(monkeypatch):
    import ray

    context = SimpleNamespace(gcs_address="")
    monkeypatch.setattr(ray, "is_initialized", lambda: context.initialized)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    context.initialized = True
    return context


def test_the_gcs_is_reachable_while_its_port_accepts_connections(fake_ray):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        fake_ray.gcs_address = f"127.0.0.1:{server.getsockname()[1]}"
        assert ray_runtime.gcs_reachable()
    assert not ray_runtime.gcs_reachable(timeout_s=0.5)  # closed: connection refused
    fake_ray.initialized = False
    assert not ray_runtime.gcs_reachable()


@pytest.mark.parametrize("address", ["", "ray://", "not an address"])
def test_an_address_that_cannot_be_told_counts_as_reachable(fake_ray, address):
    """Ray Client gives no GCS address to try: clean-up goes on as before."""
    fake_ray.gcs_address = address
    assert ray_runtime.gcs_reachable()


def test_a_runtime_context_without_an_address_counts_as_reachable(fake_ray, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace())
    assert ray_runtime.gcs_reachable()


def test_the_check_connects_to_the_last_colon_s_port_within_its_timeout(fake_ray, monkeypatch):
    """An IPv6 host keeps its colons; a host that drops packets costs the timeout (1 s by
    default), not the system's connect timeout of minutes."""
    tried = []

    class Connection:
        def close(self):
            tried.append("closed")

    def connect(address, timeout):
        tried.append((address, timeout))
        return Connection()

    monkeypatch.setattr(ray_runtime.socket, "create_connection", connect)
    fake_ray.gcs_address = "fd00::7:6379"
    assert ray_runtime.gcs_reachable()
    assert ray_runtime.gcs_reachable(timeout_s=0.25)
    assert tried == [(("fd00::7", 6379), 1.0), "closed", (("fd00::7", 6379), 0.25), "closed"]
