"""A seccomp filter for the processes that run candidate code, through the system's libseccomp.

The build's host-call allow-list keeps a candidate's *linked* code away from processes, signals and
sockets; this filter holds even for code the candidate manages to run some other way (generated at
run time, reached through a CUDA callback thread). It is a deny list on top of "allow", so CUDA,
torch and CUPTI keep every system call they use, and applies to every thread of the process
(TSYNC), including the CUDA driver's own threads. A denied call fails with EPERM, not a kill, so
the candidate sees an ordinary error and the worker still reports its status.

Denied, in every process that runs candidate code:

- new processes and programs: ``fork``, ``vfork``, ``execve``, ``execveat``, and ``clone`` without
  ``CLONE_THREAD`` (threads stay allowed; ``clone3`` answers ENOSYS, so the C library falls back to
  ``clone``, whose flags a filter can read);
- signals to any other process: ``kill``, ``tgkill`` and ``rt_(tg)sigqueueinfo`` unless aimed at
  this process, and ``tkill``, ``pidfd_open``, ``pidfd_send_signal`` outright;
- other processes' memory and the kernel's control: ``ptrace``, ``process_vm_readv/writev``,
  ``mount``, ``umount2``, ``pivot_root``, ``chroot``, ``unshare``, ``setns``, ``bpf``,
  ``userfaultfd``, ``io_uring_setup`` (its requests would bypass this filter), module loading,
  ``kexec_*``, ``reboot``, ``swapon``/``swapoff``, ``acct``, clock setting, and the key ring.

Denied in the worker only (``network=False``): sockets of any family but ``AF_UNIX``. The tool runs
(compute-sanitizer, Nsight Compute) keep them: the tools talk to the program they run over them.

libseccomp is bound with ctypes because no maintained Python binding is packaged for our hosts;
the library itself ships with every mainstream Linux distribution (systemd depends on it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket

_ALLOW = 0x7FFF0000
_CMP_NE = 1
_CMP_MASKED_EQ = 7
_ATTR_TSYNC = 4
_CLONE_THREAD = 0x00010000

_DENIED_OUTRIGHT = (
    "fork",
    "vfork",
    "execve",
    "execveat",
    "tkill",
    "pidfd_open",
    "pidfd_send_signal",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "bpf",
    "userfaultfd",
    "io_uring_setup",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "add_key",
    "request_key",
    "keyctl",
)
# What starts processes and programs, which a compile run may do.
_PROCESSES = frozenset({"fork", "vfork", "execve", "execveat"})
# Allowed only when the first argument is this process's id.
_SIGNALS_TO_SELF_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")


class _ArgumentTest(ctypes.Structure):
    """libseccomp's ``struct scmp_arg_cmp``."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


_DENY = _errno_action(errno.EPERM)


class SeccompUnavailable(RuntimeError):
    """libseccomp is missing, or the kernel refused the filter."""


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        library = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp is not installed ({exc})") from exc
    library.seccomp_init.restype = ctypes.c_void_p
    library.seccomp_init.argtypes = [ctypes.c_uint32]
    library.seccomp_release.argtypes = [ctypes.c_void_p]
    library.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    library.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    library.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgumentTest),
    ]
    library.seccomp_load.argtypes = [ctypes.c_void_p]
    return library


def restrict_system_calls(network: bool, processes: bool = False) -> None:
    """Install the filter on every thread of this process; for good (a filter cannot be lifted).
    ``network=False`` also denies sockets other than ``AF_UNIX``. ``processes=True`` leaves new
    processes and programs allowed (a Triton compile run starts ptxas and the C compiler; which
    programs it may run is Landlock's to say, ``ptxgym.sandbox.landlock``), the rest denied as
    ever. Raises SeccompUnavailable."""
    library = _library()
    context = library.seccomp_init(_ALLOW)
    if not context:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        _check(library.seccomp_attr_set(context, _ATTR_TSYNC, 1), "synchronising threads")

        def deny(name: str, *tests: _ArgumentTest, action: int = _DENY) -> None:
            number = library.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # not a system call on this architecture
                return
            array = (_ArgumentTest * len(tests))(*tests) if tests else None
            _check(
                library.seccomp_rule_add_array(context, action, number, len(tests), array),
                f"a rule for {name}",
            )

        for name in _DENIED_OUTRIGHT:
            if not (processes and name in _PROCESSES):
                deny(name)
        if not processes:
            deny("clone", _ArgumentTest(0, _CMP_MASKED_EQ, _CLONE_THREAD, 0))
            deny("clone3", action=_errno_action(errno.ENOSYS))
        for name in _SIGNALS_TO_SELF_ONLY:
            deny(name, _ArgumentTest(0, _CMP_NE, os.getpid(), 0))
        if not network:
            deny("socket", _ArgumentTest(0, _CMP_NE, socket.AF_UNIX, 0))
        _check(library.seccomp_load(context), "loading the filter")
    finally:
        library.seccomp_release(context)


def _check(result: int, what: str) -> None:
    if result < 0:
        raise SeccompUnavailable(f"seccomp: {what} failed: {os.strerror(-result)}")
