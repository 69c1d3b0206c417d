"""ptxgym: Gymnasium environments for writing fast GPU kernels with architecture-specific PTX.

Importing the package registers every task in ``envs/`` with Gymnasium::

    import gymnasium as gym
    import ptxgym

    env = gym.make("PTX-H100-MHAFwd-d128")
"""

from __future__ import annotations

import gymnasium as gym

from ptxgym import _moved
from ptxgym.tasks import registry

__version__ = "0.1.0"
ENTRY_POINT = "ptxgym.env:PTXKernelEnv"


def register_ptxgym_envs() -> list[str]:
    """Register every task (idempotent); returns the ids."""
    ids = []
    for task in registry().values():
        if task.id not in gym.registry:
            gym.register(
                id=task.id,
                entry_point=ENTRY_POINT,
                kwargs={"task_id": task.id},
                nondeterministic=True,
                max_episode_steps=task.turns,
            )
        ids.append(task.id)
    return ids


register_ptxgym_envs()
_moved.install()
