"""File access confined to a few folders, through the kernel's Landlock LSM (Linux 5.13+,
unprivileged).

The seccomp filter (``ptxgym.sandbox.seccomp``) cannot look at paths, so on its own a candidate that
reaches the kernel directly (a raw system call) could still write any file the user can (the
baseline cache, to inflate every later speedup, or another candidate's cached library) and read
any (the user's keys, other candidates' sources, the judge's environment in /proc). Under a
ruleset of :func:`confine` a process may create, write, truncate, rename or remove files only
beneath the folders it is given, write to device files (the GPU driver's) and to its own
threads' files in /proc (the driver names its threads); and, when it is given folders to read,
read and run files only beneath those. Landlock can only allow, never deny, so a read rule is an
allow-list: the system's, the toolkit's and Python's folders, never the user's home.

A ruleset holds for the thread that applies it and every thread and process started after, so
the worker applies it before it starts CUDA (whose driver threads run a candidate's host
callbacks). Run as a program (``python -I -S landlock.py --read DIR ... -- COMMAND``) it applies a
ruleset and then runs the command, which is how the compiler is confined: the ruleset survives
``execve``. It uses only the standard library, so it runs without ptxgym on the path. Bound
through raw system calls with ctypes: the C library has no wrappers, and no maintained Python
binding is packaged for our hosts.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import cast

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # x86-64 and arm64 alike
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
# ABI 6: no connecting to abstract Unix sockets made outside the ruleset's domain.
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0

_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1
_READ_FILE = 1 << 2
_READ_DIR = 1 << 3
_REMOVE_DIR = 1 << 4
_REMOVE_FILE = 1 << 5
_MAKE_CHAR = 1 << 6
_MAKE_DIR = 1 << 7
_MAKE_REG = 1 << 8
_MAKE_SOCK = 1 << 9
_MAKE_FIFO = 1 << 10
_MAKE_BLOCK = 1 << 11
_MAKE_SYM = 1 << 12
_REFER = 1 << 13  # ABI 2: moving or linking a file into another folder
_TRUNCATE = 1 << 14  # ABI 3

_WRITES_V1 = (
    _WRITE_FILE
    | _REMOVE_DIR
    | _REMOVE_FILE
    | _MAKE_CHAR
    | _MAKE_DIR
    | _MAKE_REG
    | _MAKE_SOCK
    | _MAKE_FIFO
    | _MAKE_BLOCK
    | _MAKE_SYM
)
_READS = _EXECUTE | _READ_FILE | _READ_DIR
# Rights that make sense on a file rather than a folder (the kernel refuses the others there).
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE


# Where the system keeps its programs and libraries (the dynamic loader, libc, gcc, the CUDA
# driver's library): readable by every confined process of ptxgym's.
SYSTEM_PROGRAMS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The dynamic loader's own files in /etc, which every program it starts opens.
LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")


class _RulesetAttributes(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),  # ABI 4
        ("scoped", ctypes.c_uint64),  # ABI 6
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel's struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class LandlockUnavailable(RuntimeError):
    """The kernel has no Landlock, or refused the ruleset."""


@cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _syscall() -> Callable[..., int]:
    return cast("Callable[..., int]", _libc().syscall)


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (or it is disabled)."""
    version = int(_syscall()(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION))
    return max(version, 0)


def confine(
    *,
    writable: Sequence[Path],
    readable: Sequence[Path] | None = None,
    executable: Sequence[Path] | None = None,
    scope_abstract_sockets: bool = False,
) -> None:
    """From now on this thread and everything it starts may write only beneath ``writable`` (and
    to device files and its own threads' /proc files); with ``readable``, it may also read, list
    and run files only beneath ``readable`` and ``writable``; with ``executable`` too, it may run
    only those files (a program and the dynamic loader it names, each resolved), and read them.
    A path of any list may be a file; one that does not exist is left out. With
    ``scope_abstract_sockets``, where the kernel can (ABI 6), it may not connect to an abstract
    Unix socket made outside (Python's forkserver listens on one, and forks whatever a client
    asks for). For good: a ruleset cannot be lifted. Raises LandlockUnavailable."""
    abi = abi_version()
    if abi < 1:
        raise LandlockUnavailable("the kernel has no Landlock (Linux 5.13+ with it enabled)")
    writes = _WRITES_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    handled = writes | (_READS if readable is not None or executable is not None else 0)
    # Without an executable list, whatever may be read may also be run.
    reads = _READS if executable is None else _READS & ~_EXECUTE
    syscall = _syscall()
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET if scope_abstract_sockets and abi >= 6 else 0
    attributes = _RulesetAttributes(handled, 0, scoped)
    # The kernels before ABI 6 know only the first field (a larger size with zeros is refused by
    # some of them): pass only what is used.
    size = ctypes.sizeof(attributes) if scoped else _RulesetAttributes.handled_access_net.offset
    ruleset = int(syscall(_CREATE_RULESET, ctypes.byref(attributes), size, 0))
    if ruleset < 0:
        raise LandlockUnavailable(f"creating the ruleset failed: {_last_error()}")
    try:
        for path in readable or ():
            _allow(syscall, ruleset, path, reads)
        for path in executable or ():
            _allow(syscall, ruleset, path, _EXECUTE | _READ_FILE)
        for path in writable:
            _allow(syscall, ruleset, path, handled if executable is None else handled & ~_EXECUTE)
        # Device files: the GPU driver opens its /dev nodes for writing.
        _allow(syscall, ruleset, Path("/dev"), _WRITE_FILE | (handled & _TRUNCATE))
        # The process's own threads (/proc/self resolves to this process now): the CUDA driver
        # names its threads through /proc/self/task/TID/comm and fails to start (error 304)
        # when it cannot (seen on the H200). The rest of /proc stays closed, other processes'
        # memory (/proc/PID/mem) included.
        _allow(syscall, ruleset, Path("/proc/self/task"), _WRITE_FILE | (handled & _TRUNCATE))
        if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockUnavailable(f"setting no_new_privs failed: {_last_error()}")
        if syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            raise LandlockUnavailable(f"applying the ruleset failed: {_last_error()}")
    finally:
        os.close(ruleset)


def _allow(syscall: Callable[..., int], ruleset: int, path: Path, access: int) -> None:
    try:
        descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # nothing there to allow (e.g. /lib64 on a system without it)
    try:
        if not os.path.isdir(f"/proc/self/fd/{descriptor}"):
            access &= _FILE_RIGHTS
        rule = _PathBeneath(access, descriptor)
        if syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise LandlockUnavailable(f"a rule for {path} failed: {_last_error()}")
    finally:
        os.close(descriptor)


def _last_error() -> str:
    return os.strerror(ctypes.get_errno())


def main(argv: Sequence[str]) -> None:
    """``--read PATH``, ``--write PATH`` and ``--run FILE`` (each repeatable; with ``--run``,
    only those files may be run), then ``--`` and the command to run confined to them. Exits
    with 126 and the reason when the ruleset cannot be applied: a command meant to run confined
    must not run unconfined."""
    parser = argparse.ArgumentParser(prog="landlock.py")
    parser.add_argument("--read", action="append", default=[], type=Path)
    parser.add_argument("--write", action="append", default=[], type=Path)
    parser.add_argument("--run", action="append", default=None, type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    arguments = parser.parse_args(argv)
    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    if not command:
        parser.error("no command to run")
    try:
        confine(writable=arguments.write, readable=arguments.read, executable=arguments.run)
    except (LandlockUnavailable, OSError) as exc:
        print(f"landlock.py: cannot confine {command[0]}: {exc}", file=sys.stderr)
        sys.exit(126)
    # Python ignores these signals, and an ignored signal stays ignored across execve: give the
    # command the defaults a shell would (SIGXFSZ ends a compiler at its file-size limit).
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
