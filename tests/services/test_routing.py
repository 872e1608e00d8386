"""Replica choice: rendezvous hashing for sessions, least in-flight otherwise."""

from __future__ import annotations

from collections import Counter

from toolservices.services._routing import ReplicaRouter, rendezvous_rank
from toolservices.services.base import replica_names


def test_rank_is_a_deterministic_permutation() -> None:
    names = replica_names("python", 4)
    rank = rendezvous_rank("env-7", names)
    assert sorted(rank) == [0, 1, 2, 3]
    assert rendezvous_rank("env-7", names) == rank
    assert rendezvous_rank("env-7", list(names)) == rank  # depends on names only


def test_sessions_spread_over_replicas() -> None:
    router = ReplicaRouter(replica_names("python", 4))
    spread = Counter(router.pick(f"env-{i}") for i in range(4000))
    assert set(spread) == {0, 1, 2, 3}
    assert min(spread.values()) > 4000 / 4 * 0.8


def test_dead_replica_moves_only_its_own_sessions() -> None:
    names = replica_names("python", 5)
    router = ReplicaRouter(names)
    before = {s: router.pick(f"s{s}") for s in range(2000)}
    router.mark_dead(2)
    after = {s: router.pick(f"s{s}") for s in range(2000)}
    moved = {s for s in before if before[s] != after[s]}
    assert moved == {s for s in before if before[s] == 2}
    assert all(after[s] != 2 for s in after)
    # A router that never knew replica 2 (another worker, fresh discovery) agrees.
    fresh = ReplicaRouter([n for i, n in enumerate(names) if i != 2])
    assert all(names.index(fresh.replicas[fresh.pick(f"s{s}")]) == after[s] for s in range(2000))


def test_least_in_flight_with_round_robin_ties() -> None:
    router = ReplicaRouter(replica_names("svc", 3))
    assert [router.pick(None) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    router.started(0)
    router.started(1)
    assert router.pick(None) == 2
    router.started(2)
    router.started(2)
    assert router.pick(None) in (0, 1)
    router.finished(0)
    assert router.pick(None) == 0


def test_all_dead_gives_none() -> None:
    router = ReplicaRouter(replica_names("svc", 2))
    router.mark_dead(0)
    router.mark_dead(1)
    assert router.pick("s") is None
    assert router.pick(None) is None
    router.revive_all()
    assert router.pick("s") in (0, 1)
