"""This process's connection to a Ray cluster, shared by its Ray evaluators and pool commands.

Ray is optional (``pip install 'ptxgym[ray]'``), so nothing here imports it until a connection
is asked for: :func:`import_ray` says how to install it when it is missing. The connection is
counted, not owned: the first user that needs one makes it (unless the program made it, as an
RL trainer does with ``ray.init``), and the last one done with it ends it, so an evaluator's
``close`` never cuts off another evaluator, or the program, of the same process.

``ptxgym.evaluate.ray_served`` starts and finds pools over this connection, and
``ptxgym.evaluate.ray_pool`` evaluates on them.
"""

from __future__ import annotations

import os
import threading
from types import ModuleType

# The connection's users, and whether it was made here (then the last user ends it).
_connection_lock = threading.Lock()
_connection_users = 0
_connected_here = False


def import_ray() -> ModuleType:
    """Ray, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("evaluating on a Ray pool needs Ray: pip install 'ptxgym[ray]'") from exc
    return ray


def connect(address: str | None) -> ModuleType:
    """Ray, connected: to ``address`` (``auto``, ``ray://HOST:PORT``), or to a new local cluster
    when it is None. A connection the program already made is used as it is. Each call is
    paired with a :func:`disconnect`."""
    global _connection_users, _connected_here
    ray = import_ray()
    with _connection_lock:
        if not ray.is_initialized():
            if address is None:
                # Every core for builds; GPUs as Ray finds them. No dashboard: nothing reads it.
                ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False)
            else:
                ray.init(address=address)
            _connected_here = True
        _connection_users += 1
    return ray


def disconnect() -> None:
    """Done with the connection of a :func:`connect`: it ends with its last user, when it was
    made here."""
    global _connection_users, _connected_here
    ray = import_ray()
    with _connection_lock:
        _connection_users -= 1
        if _connection_users == 0 and _connected_here:
            ray.shutdown()
            _connected_here = False


def connected(address: str | None) -> _Connected:
    """``with connected(address) as ray: ...``: Ray connected for pool commands
    (``serve_pool``, ``pool_members``, ``stop_pool``), and disconnected after when the
    connection was made here."""
    return _Connected(address)


class _Connected:
    def __init__(self, address: str | None) -> None:
        self.address = address

    def __enter__(self) -> ModuleType:
        return connect(self.address)

    def __exit__(self, *exc: object) -> None:
        disconnect()


def actor_exception(exc: BaseException) -> BaseException:
    """The exception raised inside an actor, for one that Ray hands on wrapped (else ``exc``)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
