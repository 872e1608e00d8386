"""Services on a Ray cluster of several nodes: Ray's own ``ray.cluster_utils.Cluster``.

A head and three worker nodes, all on this machine, each with a custom
resource of its own (``head``, ``node1``..``node3``) so that tasks and actors
can be placed on a chosen node, and one ``executor`` slot each: a service
asking for one slot per replica lands its replicas on distinct nodes, and
a spare slot is left for Ray to restart a replica whose node was removed.
Nodes are small (one CPU, 75 MB of object store) so the module runs on a
2-core CI machine. The module starts and stops the cluster itself; the
node-removal test runs last because it changes the cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
import svc_helpers
from svc_helpers import Counter, new_namespace

from toolservices.env import ToolEnv, python_tool
from toolservices.errors import InfrastructureError
from toolservices.services import ServiceExecutor, ServiceRegistry, get_services

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")
PythonExecutorService = pytest.importorskip("toolservices.python").PythonExecutorService

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

MB = 1024 * 1024
WORKERS = ("node1", "node2", "node3")
NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 75 * MB}
#: Ray notices a dead node after about 1 s instead of its default ~30 s (the
#: head checks each raylet every 300 ms and gives up after 3 misses), so that
#: the node-removal test does not spend its time waiting for Ray.
HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 300,
    "health_check_timeout_ms": 300,
    "health_check_failure_threshold": 3,
}
#: The executor's own limit per call, and the client's bound on every call.
EXEC_TIMEOUT = 10.0
CALL_TIMEOUT = 30.0


@dataclass
class Nodes:
    cluster: Any
    workers: dict[str, Any]  # resource name -> ray._private.node.Node
    ids: dict[str, str]  # resource name -> node id (hex), head included


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    was_running = ray.is_initialized()
    if was_running:  # the package's single-node Ray: put back afterwards
        ray.shutdown()
    cluster = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            **NODE_ARGS,
            "resources": {"head": 1, "executor": 1},
            "include_dashboard": False,
            "_system_config": HEALTH_CHECKS,
        },
    )
    try:
        workers = {
            name: cluster.add_node(**NODE_ARGS, resources={name: 1, "executor": 1})
            for name in WORKERS
        }
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        ray.cloudpickle.register_pickle_by_value(svc_helpers)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        ids = {name: node.node_id for name, node in workers.items()}
        ids["head"] = cluster.head_node.node_id
        yield Nodes(cluster, workers, ids)
    finally:
        ray.shutdown()
        cluster.shutdown()
        if was_running:
            ray.init(**svc_helpers.RAY_INIT_CONFIG)


@pytest.fixture(scope="module")
def executor(nodes: Nodes) -> Iterator[ServiceRegistry]:
    """One executor with a replica on each of three nodes; restarted by Ray up to twice."""
    registry = get_services("ray", namespace=new_namespace())
    registry.register(
        "python",
        PythonExecutorService,
        pool_size=2,
        timeout=EXEC_TIMEOUT,
        max_sessions=256,
        spares=0,
        num_cpus=0,
        resources={"executor": 1},
        num_replicas=3,
        max_restarts=2,
    )
    try:
        yield registry
    finally:
        registry.shutdown()


def _node_of(handle: Any) -> str:
    return str(ray.get(handle.__ray_call__.remote(lambda self: _here()), timeout=CALL_TIMEOUT))


def _here() -> str:
    return str(ray.get_runtime_context().get_node_id())


def _sessions_on_every_replica(client: Any, prefix: str, count: int) -> list[str]:
    sessions = [f"{prefix}-{i}" for i in range(count)]
    assert {client.replica_for(s) for s in sessions} == set(range(client.num_replicas))
    return sessions


def _on(node: str) -> dict[str, Any]:
    """Ray options that place a task or actor on ``node``."""
    return {"num_cpus": 0, "resources": {node: 0.01}}


# -- placement and affinity -------------------------------------------------------------------


def test_replicas_land_on_distinct_nodes(nodes: Nodes, executor: ServiceRegistry) -> None:
    placed = [_node_of(handle) for handle in executor.replicas("python")]
    assert len(set(placed)) == 3
    assert set(placed) <= set(nodes.ids.values())


@ray.remote
def _run_in_task(namespace: str, sessions: list[str], code: str) -> tuple[str, list[str]]:
    client = get_services("ray", namespace=namespace).client("python", timeout=CALL_TIMEOUT)
    return _here(), [client.call("execute", code, session_id=s)["stdout"] for s in sessions]


@ray.remote
class _Caller:
    """An actor on another node that calls the service through its own client."""

    def __init__(self, namespace: str) -> None:
        self.client = get_services("ray", namespace=namespace).client("python")

    def run(self, sessions: list[str], code: str) -> tuple[str, list[str]]:
        return _here(), [
            self.client.call("execute", code, session_id=s)["stdout"] for s in sessions
        ]


def test_sessions_reach_their_replica_from_tasks_and_actors_on_other_nodes(
    nodes: Nodes, executor: ServiceRegistry
) -> None:
    client = executor.client("python", timeout=CALL_TIMEOUT)
    sessions = _sessions_on_every_replica(client, "aff", 9)
    for i, session in enumerate(sessions):
        assert client.call("execute", f"v = {i}", session_id=session)["success"]
    namespace = executor.namespace
    # A task on each worker node reads every session's variable...
    refs = [_run_in_task.options(**_on(n)).remote(namespace, sessions, "print(v)") for n in WORKERS]
    for name, (where, outputs) in zip(WORKERS, ray.get(refs, timeout=120), strict=True):
        assert where == nodes.ids[name]
        assert outputs == [f"{i}\n" for i in range(len(sessions))]
    # ...and an actor on each worker node in turn changes it: the changes add up.
    for name in WORKERS:
        caller = _Caller.options(**_on(name)).remote(namespace)
        where, _ = ray.get(caller.run.remote(sessions, "v += 100"), timeout=120)
        assert where == nodes.ids[name]
        ray.kill(caller)
    outputs = [client.call("execute", "print(v)", session_id=s)["stdout"] for s in sessions]
    assert outputs == [f"{i + 300}\n" for i in range(len(sessions))]
    for session in sessions:
        client.call("close_session", session_id=session)


# -- registration race ---------------------------------------------------------------------------


@ray.remote(num_cpus=0)
class _Barrier:
    """Releases every waiter once ``parties`` have arrived (bounded by ``timeout``)."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.all_in = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        self.arrived += 1
        if self.arrived >= self.parties:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), timeout)


@ray.remote
def _get_or_register_at_once(namespace: str, barrier: Any) -> tuple[str, str, str]:
    ray.get(barrier.wait.remote(60.0))
    registry = get_services("ray", namespace=namespace)
    handle = registry.get_or_register("shared", Counter, marker=_here(), num_replicas=3, num_cpus=0)
    ident = registry.client("shared").call("whoami")
    return _here(), handle._actor_id.hex(), ident


def test_get_or_register_from_three_nodes_at_once(nodes: Nodes) -> None:
    registry = get_services("ray", namespace=new_namespace())
    try:
        barrier = _Barrier.remote(len(WORKERS))
        refs = [
            _get_or_register_at_once.options(**_on(n)).remote(registry.namespace, barrier)
            for n in WORKERS
        ]
        results = ray.get(refs, timeout=120)
        assert [where for where, _, _ in results] == [nodes.ids[n] for n in WORKERS]
        assert len({actor for _, actor, _ in results}) == 1  # one service for all
        assert len({ident for _, _, ident in results}) == 1  # the same replica 0 object
        assert registry.list() == ["shared"]
        assert len(registry.replicas("shared")) == 3  # the losers left no replica behind
        names = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == registry.namespace
        ]
        assert len(names) == 3
        winner = ray.get(registry.get("shared").__ray_call__.remote(lambda self: self.marker))
        assert winner in {nodes.ids[n] for n in WORKERS}
        ray.kill(barrier)
    finally:
        registry.shutdown()


# -- episodes through the service ------------------------------------------------------------------


def _python_call(code: str) -> str:
    body = json.dumps({"name": "python", "arguments": {"code": code}})
    return f"<tool_call>\n{body}\n</tool_call>"


async def test_tool_env_keeps_per_episode_state_across_replicas(
    executor: ServiceRegistry,
) -> None:
    client = executor.client("python", timeout=CALL_TIMEOUT)
    remote = ServiceExecutor(client, timeout=EXEC_TIMEOUT)
    env = ToolEnv([python_tool(remote)], python=remote, max_turns=4)
    batch = 8
    env.reset([f"item {i}" for i in range(batch)])
    try:
        sessions = [episode.python_session for episode in env.episodes]
        assert all(sessions) and len(set(sessions)) == batch
        assert len({client.replica_for(s) for s in sessions}) >= 2  # several nodes
        await env.astep([_python_call(f"x = {i}\nhistory = [x]") for i in range(batch)])
        await env.astep([_python_call(f"history.append(x * 10 + {i})") for i in range(batch)])
        step = await env.astep([_python_call("print(history)") for _ in range(batch)])
        assert not any(step.done)
        for i, messages in enumerate(env.messages):
            assert messages[-1]["content"] == f"{[i, i * 10 + i]}\n", messages[-1]
    finally:
        await env.aclose()
    # Closing the batch ended every session: a new call starts from nothing.
    out = await client.acall("execute", "print('x' in globals())", session_id=sessions[0])
    assert out["stdout"] == "False\n"
    await client.acall("close_session", session_id=sessions[0])


# -- shutdown -------------------------------------------------------------------------------------


def _raylet_pids(nodes: Nodes) -> list[int]:
    pids = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "raylet" in (proc.info["name"] or "") and f"={nodes.cluster.address}" in cmdline:
            pids.append(proc.pid)
    return pids


def _executor_processes(raylets: list[int]) -> list[psutil.Process]:
    """Actors of the executor and everything they started, under this cluster's raylets."""
    found = []
    for pid in raylets:
        try:
            for proc in psutil.Process(pid).children(recursive=True):
                try:
                    title = " ".join(proc.cmdline())
                except psutil.Error:
                    continue
                if "PythonExecutorService" in title or "_toolservices_runtime" in title:
                    found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def test_shutdown_leaves_no_actor_or_interpreter_on_any_node(nodes: Nodes) -> None:
    registry = get_services("ray", namespace=new_namespace())
    try:
        registry.register(
            "py", PythonExecutorService, pool_size=1, spares=1, num_cpus=0, num_replicas=3
        )
        client = registry.client("py", timeout=CALL_TIMEOUT)
        for session in _sessions_on_every_replica(client, "sd", 9):
            assert client.call("execute", "x = 1", session_id=session)["success"]
        actors = []
        for handle in registry.replicas("py"):
            pid, where = ray.get(
                handle.__ray_call__.remote(lambda self: (os.getpid(), _here())),
                timeout=CALL_TIMEOUT,
            )
            actors.append(psutil.Process(pid))
        processes = [p for actor in actors for p in (actor, *actor.children(recursive=True))]
        assert all(actor.children() for actor in actors)  # each started its fork server
        raylets = _raylet_pids(nodes)
        assert len(raylets) == 4
        assert {a.pid for a in actors} <= {p.pid for p in _executor_processes(raylets)}
    finally:
        registry.shutdown()
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert alive == []
    assert registry.list() == []
    assert [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == registry.namespace
    ] == []
    leftovers = [p for p in _executor_processes(raylets) if p.pid in {q.pid for q in processes}]
    assert leftovers == []


# -- a node goes away (last: it changes the cluster) ----------------------------------------------


def _outcome(client: Any, code: str, session: str) -> tuple[float, Any]:
    """(seconds, result or the infrastructure error) of one call."""
    started = time.monotonic()
    try:
        result: Any = client.call("execute", code, session_id=session)
    except InfrastructureError as exc:
        result = exc
    return time.monotonic() - started, result


def test_worker_node_removed_mid_run(nodes: Nodes, executor: ServiceRegistry) -> None:
    client = executor.client("python", timeout=CALL_TIMEOUT)
    sessions = _sessions_on_every_replica(client, "nd", 24)
    for i, session in enumerate(sessions):
        assert client.call("execute", f"v = {i}", session_id=session)["success"]
    placed = [_node_of(handle) for handle in executor.replicas("python")]
    victim = next(i for i, where in enumerate(placed) if where != nodes.ids["head"])
    victim_node = next(n for n in nodes.workers.values() if n.node_id == placed[victim])
    moved = [s for s in sessions if client.replica_for(s) == victim]
    kept = [s for s in sessions if s not in moved]

    # One call is in flight on the victim when its node goes away (the snippet
    # would end well before the executor's limit if nothing happened).
    in_flight: dict[str, Any] = {}
    caller = threading.Thread(
        target=lambda: in_flight.update(out=_outcome(client, "time.sleep(5)", moved[0]))
    )
    client.call("execute", "import time", session_id=moved[0])
    caller.start()
    deadline = time.monotonic() + 60
    while client.in_flight()[victim] == 0:  # bounded: the thread has sent its call
        assert time.monotonic() < deadline, "the call was never sent"
        threading.Event().wait(0.01)

    nodes.cluster.remove_node(victim_node, allow_graceful=False)
    caller.join(timeout=CALL_TIMEOUT + 10)
    assert not caller.is_alive()
    seconds, result = in_flight["out"]
    assert seconds < CALL_TIMEOUT + 5
    assert isinstance(result, InfrastructureError) and result.retryable, result
    assert client.replica_for(moved[0]) == victim  # not given up: Ray restarts it

    # Every call returns within its timeout: a result, or a retryable error
    # while Ray restarts the replica on a live node.
    lost: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    for session in moved:
        while session not in lost:
            assert time.monotonic() < deadline, f"{session} never came back"
            seconds, result = _outcome(client, "print(v)", session)
            assert seconds < CALL_TIMEOUT + 5
            if isinstance(result, InfrastructureError):
                assert result.retryable, result
            else:
                lost[session] = result
    for result in lost.values():  # their state is gone, and the result says so
        assert result.restarted and "NameError" in result.stderr, result
    # Sessions on the other replicas kept theirs.
    for session in kept:
        out = client.call("execute", "print(v)", session_id=session)
        assert out["stdout"] == f"{sessions.index(session)}\n", (session, out)

    # The restarted replica is on a live node and serves the moved sessions and new ones.
    assert _node_of(executor.replicas("python")[victim]) not in (placed[victim],)
    fresh_client = executor.client("python", timeout=CALL_TIMEOUT)
    new = [s for s in (f"new-{i}" for i in range(40)) if client.replica_for(s) == victim][:3]
    for session in [*moved, *new]:
        assert fresh_client.replica_for(session) == victim
        assert client.call("execute", "w = 7", session_id=session)["success"]
        assert fresh_client.call("execute", "print(w)", session_id=session)["stdout"] == "7\n"
