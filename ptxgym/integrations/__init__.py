"""Adapters that put ptxgym's tasks, evaluators and rewards into other frameworks' hooks.

``verl``: verl's custom reward function (``compute_score``), its multi-turn tool
(``KernelTool``) and, for the verl releases that have them, its interactions
(``KernelInteraction``). Each adapter imports its framework only when used, so ptxgym installs
and imports without any of them.
"""
