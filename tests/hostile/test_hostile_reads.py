"""Reads by candidate code, on the CPU: a confined process (``ptxgym.sandbox.isolation.confine``,
what the worker runs under from before CUDA starts) reads the system's, Python's and ptxgym's own
files, and nothing of the user's: not a file in another folder (the user's home, the project,
ptxgym's cache), not another process's environment, whether through Python or a raw system call, and
it cannot reach an abstract Unix socket made outside (Python's forkserver listens on one).

Each probe is a class of read, tried several ways; on today's kernel (Landlock ABI 6+, as CI's)
all of them must be refused.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ptxgym.sandbox import landlock

pytestmark = pytest.mark.skipif(landlock.abi_version() < 1, reason="the kernel has no Landlock")

_PROBE = r"""
import ctypes, errno, json, os, socket, sys
from pathlib import Path
from ptxgym.sandbox.isolation import confine

folder, secret_file, abstract_name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
facts = confine(folder)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = {"facts": facts}

def python_read(name, path):
    try:
        results[name] = Path(path).read_bytes().decode("latin-1")[:200]
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno, str(exc.errno))

def raw_read(name, path):
    # openat(AT_FDCWD, path, O_RDONLY) as raw machine code would make it: no C library wrapper.
    fd = libc.syscall(257, -100, path.encode(), os.O_RDONLY)
    if fd < 0:
        results[name] = errno.errorcode.get(ctypes.get_errno(), "?")
        return
    data = os.read(fd, 200)
    os.close(fd)
    results[name] = data.decode("latin-1")

python_read("secret", secret_file)
raw_read("secret_raw", secret_file)
python_read("secret_folder_listing", str(Path(secret_file).parent))
python_read("parent_environ", f"/proc/{os.getppid()}/environ")
raw_read("parent_environ_raw", f"/proc/{os.getppid()}/environ")
python_read("parent_cmdline", f"/proc/{os.getppid()}/cmdline")
try:
    results["listing_secret_folder"] = os.listdir(Path(secret_file).parent)
except OSError as exc:
    results["listing_secret_folder"] = errno.errorcode.get(exc.errno, str(exc.errno))
(folder / "own").write_text("mine")
python_read("own", str(folder / "own"))
python_read("system", "/etc/ld.so.cache")
python_read("own_status", "/proc/self/status")
# What a worker imports after confinement: the task's input generators and references.
import kernels_ref.gemm
results["kernels_ref"] = kernels_ref.gemm.__name__
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    client.connect("\0" + abstract_name)
    results["abstract_socket"] = "connected"
except OSError as exc:
    results["abstract_socket"] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(results))
"""


@pytest.fixture
def probe(tmp_path: Path) -> dict[str, Any]:
    """Run the probe confined to its own folder, beside a secret file and a listening abstract
    socket of this (unconfined) process; what it could see."""
    token = secrets.token_hex(16)
    secret_folder = tmp_path / "home" / ".config"
    secret_folder.mkdir(parents=True)
    secret_file = secret_folder / "token"
    secret_file.write_text(token)
    abstract_name = f"ptxgym-test-{token}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + abstract_name)
    listener.listen(1)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                _PROBE,
                str(tmp_path / "worker"),
                str(secret_file),
                abstract_name,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PTXGYM_TEST_SECRET": token},
            check=False,
        )
    finally:
        listener.close()
    assert result.returncode == 0, result.stderr
    facts: dict[str, Any] = json.loads(result.stdout)
    facts["token"] = token
    return facts


def test_a_confined_process_reads_nothing_of_the_users(probe: dict[str, Any]) -> None:
    assert probe["facts"]["reads_confined"] is True
    for read in ("secret", "secret_raw", "secret_folder_listing", "listing_secret_folder"):
        assert probe[read] == "EACCES", read
    assert probe["token"] not in json.dumps({k: v for k, v in probe.items() if k != "token"})


def test_a_confined_process_reads_no_other_process(probe: dict[str, Any]) -> None:
    for read in ("parent_environ", "parent_environ_raw", "parent_cmdline"):
        assert probe[read] == "EACCES", read


def test_a_confined_process_still_reads_what_it_needs(probe: dict[str, Any]) -> None:
    assert probe["own"] == "mine"
    assert probe["system"] != "EACCES" and probe["own_status"].startswith("Name:")
    assert probe["kernels_ref"] == "kernels_ref.gemm"


@pytest.mark.skipif(landlock.abi_version() < 6, reason="abstract sockets are scoped from ABI 6")
def test_a_confined_process_reaches_no_abstract_socket_made_outside(probe: dict[str, Any]) -> None:
    # Abstract sockets belong to a network namespace: a worker that has its own (where the OS
    # lets it unshare one, as root on the H200 host) finds no listener there at all; one that
    # shares the host's is refused by Landlock's scope.
    isolated = probe["facts"]["network_isolated"]
    assert probe["abstract_socket"] == ("ECONNREFUSED" if isolated else "EPERM")


def test_installed_packages_stay_readable_and_the_checkout_does_not() -> None:
    import numpy

    from ptxgym.sandbox.isolation import readable_paths

    readable = readable_paths()
    site = Path(numpy.__file__).resolve().parents[1]
    assert any(site.is_relative_to(folder) for folder in readable), site
    checkout = Path(__file__).resolve().parents[2]
    assert not any(checkout.is_relative_to(folder) for folder in readable)
    assert checkout / "ptxgym" in readable
