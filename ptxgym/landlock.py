"""Writes confined to a few folders, through the kernel's Landlock LSM (Linux 5.13+, unprivileged).

The seccomp filter (``ptxgym.seccomp``) cannot look at paths, so on its own a candidate that
reaches the kernel directly (a raw system call) could still write any file the user can: the
baseline cache, to inflate every later speedup, or another candidate's cached library. Under
this ruleset the process may create, write, truncate, rename or remove files only beneath the
folders it is given (its own folder), write to device files (the GPU driver's) and to its own
threads' files in /proc (the driver names its threads). Reading stays
allowed everywhere: CUDA, torch and Python load files from all over the system, and Landlock can
only allow, not deny, so "everything but the user's secrets" cannot be said.

A ruleset holds for the thread that applies it and every thread and process started after, so
the worker applies it before it starts CUDA (whose driver threads run a candidate's host
callbacks). Bound through raw system calls with ctypes: the C library has no wrappers, and no
maintained Python binding is packaged for our hosts.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import cast

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # x86-64 and arm64 alike
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

_WRITE_FILE = 1 << 1
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


class _RulesetAttributes(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


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


def confine_writes(writable: list[Path]) -> None:
    """From now on this thread and everything it starts may write only beneath ``writable`` (and
    to device files). For good: a ruleset cannot be lifted. Raises LandlockUnavailable."""
    abi = abi_version()
    if abi < 1:
        raise LandlockUnavailable("the kernel has no Landlock (Linux 5.13+ with it enabled)")
    handled = _WRITES_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    syscall = _syscall()
    attributes = _RulesetAttributes(handled)
    ruleset = int(syscall(_CREATE_RULESET, ctypes.byref(attributes), ctypes.sizeof(attributes), 0))
    if ruleset < 0:
        raise LandlockUnavailable(f"creating the ruleset failed: {_last_error()}")
    try:
        for folder in writable:
            _allow(syscall, ruleset, folder, handled)
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


def _allow(syscall: Callable[..., int], ruleset: int, folder: Path, access: int) -> None:
    descriptor = os.open(folder, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _PathBeneath(access, descriptor)
        if syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise LandlockUnavailable(f"a rule for {folder} failed: {_last_error()}")
    finally:
        os.close(descriptor)


def _last_error() -> str:
    return os.strerror(ctypes.get_errno())
