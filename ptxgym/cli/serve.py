"""``ptxgym serve``: start, list or end a named pool of build and judge actors on a Ray cluster,
for ``run --evaluator ray://...`` (needs ``ptxgym[ray]``)."""

from __future__ import annotations

import argparse
from typing import Any

from ptxgym.cli.common import UnavailableError, add_judge_options, judge_settings


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serving = commands.add_parser(
        "serve",
        help="serve build and judge actors on a Ray cluster, for `run --evaluator ray://...` "
        "(needs ptxgym[ray])",
    )
    serving.add_argument(
        "--address",
        default="auto",
        help="the Ray cluster: auto (the one this machine is a node of; the default) or "
        "ray://HOST:PORT",
    )
    serving.add_argument(
        "--name", default=None, metavar="POOL", help="the pool's name (default: ptxgym)"
    )
    action = serving.add_mutually_exclusive_group()
    action.add_argument("--status", action="store_true", help="list the pool's actors")
    action.add_argument("--stop", action="store_true", help="end the pool")
    shape = serving.add_argument_group("the pool to start")
    shape.add_argument(
        "--judge",
        choices=("gpu", "compile-only"),
        default="gpu",
        help="gpu: one judge per GPU (the default); compile-only: no GPU, builds are inspected",
    )
    shape.add_argument("--gpus", type=int, metavar="N", help="GPU judges (default: every GPU)")
    shape.add_argument(
        "--arch",
        action="append",
        metavar="SM",
        help="compile-only: a judge serving this generation (sm_90, sm_100); repeat for more "
        "(default: one each)",
    )
    shape.add_argument("--builders", type=int, metavar="N", help="default: one per node")
    shape.add_argument(
        "--builds-per-builder", type=int, metavar="N", help="builds one builder runs at once"
    )
    shape.add_argument(
        "--max-in-flight", type=int, metavar="N", help="requests one judge holds at once"
    )
    add_judge_options(serving.add_argument_group("what GPU judges run (as for eval)"))
    serving.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    """Start (or list, or end) a named pool on a Ray cluster, and say how to reach it."""
    from ptxgym.evaluate import ray_served
    from ptxgym.evaluate.errors import EvaluatorError
    from ptxgym.evaluate.ray_actors import PoolError
    from ptxgym.evaluate.ray_connection import connected

    name = args.name or ray_served.DEFAULT_POOL
    try:
        with connected(args.address) as ray:
            if args.stop:
                count = ray_served.stop_pool(name)
                print(f"Pool {name!r} ended ({count} actors).")
                return 0
            if args.status:
                members = ray_served.pool_members(name)
            else:
                spec = ray_served.plan_pool(
                    judge=args.judge,
                    arches=args.arch,
                    gpus=args.gpus,
                    builders=args.builders,
                    builds_per_builder=args.builds_per_builder,
                    max_in_flight=args.max_in_flight,
                    settings=judge_settings(args) if args.judge == "gpu" else None,
                )
                members = ray_served.serve_pool(name, spec)
            client = _client_address(args.address, ray)
    except (EvaluatorError, PoolError, ImportError, ConnectionError) as exc:
        raise UnavailableError(str(exc)) from exc
    print(f"Pool {name!r} on the Ray cluster ({len(members)} actors):")
    for member in members:
        print(f"  {member.describe()}")
    pool = "" if name == ray_served.DEFAULT_POOL else f"/{name}"
    print(
        f"It runs until `ptxgym serve --stop{'' if not pool else ' --name ' + name}` or the "
        "cluster ends. Reach it:\n"
        f"  ptxgym run --evaluator {client}{pool} ...\n"
        f"  RayEvaluator(address={client!r}, pool={name!r})   # ptxgym.evaluate.ray_pool\n"
        f"  gym.make(ID, evaluator={client + pool!r})\n"
        f"From a node of the cluster, ray://auto{pool} reaches it without Ray Client."
    )
    return 0


def _client_address(address: str, ray: Any) -> str:
    """How a client off the cluster reaches it: Ray Client on the head node (port 10001 unless
    `ray start --ray-client-server-port` said otherwise)."""
    if address.startswith("ray://"):
        return address
    head = str(ray.get_runtime_context().gcs_address).rpartition(":")[0]
    return f"ray://{head}:10001"
