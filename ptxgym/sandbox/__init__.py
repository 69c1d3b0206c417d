"""Confinement of untrusted processes (workers, single calls, report readers, compilers):
``isolation`` (what a confined process may see, and the order it is sealed in), ``seccomp``
(system-call filter), ``landlock`` (file-system and socket rules), ``processes`` (process groups
that end whole) and ``channel`` (the framed message channel between judge and worker)."""
