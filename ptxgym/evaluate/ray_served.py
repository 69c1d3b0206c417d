"""Pools of builder and judge actors on a Ray cluster: shaped, started, found by name and ended.

A pool is its directory actor (``ptxgym.evaluate.ray_actors.Pool``), which starts its members
and replaces one that died. It serves either one ``RayEvaluator`` (``ptxgym.evaluate.ray_pool``)
that started it, unnamed, until that evaluator's ``close``; or, started by ``ptxgym serve``, any
number of clients: named and detached in the ``ptxgym`` namespace, it runs until ``stop_pool``
(or the cluster's end), whoever connects and leaves, and clients reach it by name
(``ray://HOST:PORT/NAME``, read by :func:`parse_spec`).

:func:`plan_pool` shapes a pool from the connected cluster's resources, :func:`start_pool`
starts one, :func:`serve_pool` starts a named one, :func:`served_pool` finds it, and
:func:`pool_members` and :func:`stop_pool` answer ``ptxgym serve --status`` and ``--stop``.
Everything here runs on the connection of ``ptxgym.evaluate.ray_connection``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ptxgym.build.result import DEFAULT_COMPILE_TIMEOUT_S
from ptxgym.evaluate.errors import EvaluatorError
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.ray_actors import JudgeKind, Member, Pool, PoolError, PoolSpec
from ptxgym.evaluate.ray_connection import actor_exception, import_ray

NAMESPACE = "ptxgym"
"""The Ray namespace of served pools."""
DEFAULT_POOL = "ptxgym"
"""The name ``ptxgym serve`` gives a pool unless told otherwise."""
DEFAULT_ARCHES = ("sm_90", "sm_100")
"""What compile-only judges serve unless told otherwise: one judge per task target."""
START_TIMEOUT_S = 600.0
"""How long a pool's actors may take to start unless told otherwise: a GPU judge's first start
on a host takes minutes (torch, CUDA)."""
_CLIENT_PREFIX = "ray://"
# Calls the pool's directory answers at once (clients asking for members or replacements).
_DIRECTORY_CONCURRENCY = 32


def parse_spec(spec: str) -> tuple[str, str]:
    """``ray://HOST:PORT[/POOL]`` (a cluster through Ray Client) or ``ray://auto[/POOL]`` (the
    cluster this machine is a node of) -> (Ray address, pool name)."""
    if not spec.startswith(_CLIENT_PREFIX):
        raise ValueError(f"{spec!r} is not a Ray evaluator: ray://HOST:PORT[/POOL] or ray://auto")
    where, _, pool = spec[len(_CLIENT_PREFIX) :].partition("/")
    if not where:
        raise ValueError(f"{spec!r} names no cluster: ray://HOST:PORT[/POOL] or ray://auto")
    address = "auto" if where == "auto" else _CLIENT_PREFIX + where
    return address, pool.strip("/") or DEFAULT_POOL


def plan_pool(
    *,
    judge: JudgeKind | None = None,
    arches: Sequence[str] | None = None,
    gpus: int | None = None,
    builders: int | None = None,
    builds_per_builder: int | None = None,
    max_in_flight: int | None = None,
    compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
    settings: JudgeSettings | None = None,
) -> PoolSpec:
    """A pool's spec, its defaults taken from the connected cluster: GPU judges on every GPU
    (compile-only judges for ``DEFAULT_ARCHES``), one builder per node, builds shared among
    the CPUs the judges leave. Refuses a pool the cluster has not the resources for."""
    ray = import_ray()
    resources = ray.cluster_resources()
    kind: JudgeKind = judge or "gpu"
    if kind == "gpu":
        gpus = int(resources.get("GPU", 0)) if gpus is None else gpus
        if gpus < 1:
            raise PoolError(
                "the cluster has no GPU for a GPU judge; judge='compile-only' (ptxgym serve "
                "--judge compile-only) builds and inspects without one"
            )
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    builders = builders or max(1, nodes)
    judge_cpus = gpus if kind == "gpu" and gpus else 0
    spare = int(resources.get("CPU", 1)) - judge_cpus
    spec = PoolSpec(
        judge=kind,
        gpus=gpus if kind == "gpu" and gpus else 0,
        arches=tuple(arches or DEFAULT_ARCHES) if kind == "compile-only" else tuple(arches or ()),
        builders=builders,
        builds_per_builder=builds_per_builder or max(1, min(4, spare // builders)),
        max_in_flight=max_in_flight or (settings or JudgeSettings()).concurrency,
        compile_timeout_s=compile_timeout_s,
        settings=settings,
    )
    for name, needed in spec.needs().items():
        have = float(resources.get(name, 0))
        if needed > have:
            raise PoolError(
                f"the pool asks for {needed:g} {name} and the cluster has {have:g}: give fewer "
                "builders, builds_per_builder or gpus"
            )
    return spec


def start_pool(
    spec: PoolSpec, start_timeout_s: float = START_TIMEOUT_S, *, name: str | None = None
) -> tuple[Any, list[Member]]:
    """Start a pool on the connected cluster: its directory and its members, once every member
    has started. Unnamed, it is this process's and ends with it (or sooner, killed by its
    user); named, it is detached and outlives it. A pool that fails to start is ended."""
    ray = import_ray()
    # Other clients find a served pool by its name in NAMESPACE; detached, it outlives this
    # process, which only started it.
    served = {} if name is None else {"name": name, "namespace": NAMESPACE, "lifetime": "detached"}
    directory = (
        ray.remote(Pool)
        .options(num_cpus=0, max_concurrency=_DIRECTORY_CONCURRENCY, max_restarts=0, **served)
        .remote(spec)
    )
    try:
        members: list[Member] = _remote_call(ray, directory.start.remote(start_timeout_s))
    except BaseException:
        ray.kill(directory)
        raise
    return directory, members


def serve_pool(name: str, spec: PoolSpec, start_timeout_s: float = START_TIMEOUT_S) -> list[Member]:
    """Start a named, detached pool on the connected cluster; it runs until ``stop_pool``
    (or the cluster's end), whoever connects and leaves."""
    ray = import_ray()
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        pass
    else:
        raise EvaluatorError(
            f"a pool named {name!r} already runs: `ptxgym serve --stop --name {name}` ends it"
        )
    _, members = start_pool(spec, start_timeout_s, name=name)
    return members


def served_pool(name: str) -> tuple[Any, list[Member]]:
    """The directory of the pool served under ``name`` on the connected cluster, and its
    members."""
    ray = import_ray()
    try:
        directory = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        raise EvaluatorError(
            f"no pool named {name!r} runs on this Ray cluster: start one there with "
            f"`ptxgym serve --name {name}`"
        ) from None
    members: list[Member] = _remote_call(ray, directory.members.remote())
    return directory, members


def pool_members(name: str) -> list[Member]:
    """The members of the pool served under ``name`` on the connected cluster."""
    _, members = served_pool(name)
    return members


def stop_pool(name: str) -> int:
    """End the pool served under ``name`` on the connected cluster; how many actors it had."""
    ray = import_ray()
    directory, members = served_pool(name)
    _remote_call(ray, directory.shutdown.remote(), timeout_s=60)
    ray.kill(directory)
    return len(members)


def _remote_call(ray: ModuleType, ref: Any, timeout_s: float | None = None) -> Any:
    """``ray.get`` of one call to a pool's directory, its PoolError (or death) as an
    EvaluatorError."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.RayError as exc:
        raise EvaluatorError(f"the pool failed: {actor_exception(exc)}") from None
