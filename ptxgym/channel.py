"""A message channel that never unpickles what the other side sends.

The judge (trusted) talks to workers that run candidate code (untrusted). Unpickling bytes from
an untrusted process would let it run code in the judge, so messages are JSON headers followed by
raw tensor frames, each size-checked, and tensors are rebuilt from bytes with their declared
dtype and shape.

Large outputs go through an ``Arena`` instead of the pipe: a shared-memory region the judge
creates for one evaluation and hands to the worker as a file descriptor. The worker copies a
message's tensors into it and names their offsets in the header; the judge checks that every
tensor lies inside the region and reads it there. Both sides take turns (the worker writes the
next message only after the judge's ``continue``), and the region holds nothing but the worker's
own outputs, so no name or path from the worker is ever opened.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MAX_HEADER_BYTES = 1 << 20
MAX_FRAME_BYTES = 16 << 30
_DTYPES = ("bfloat16", "float32", "int32", "float16", "int64")


_ALIGNMENT = 256  # each tensor's offset in an arena: aligned for any dtype and for fast copies


class ChannelError(RuntimeError):
    """The other side sent something that is not a well-formed message."""


class Arena:
    """A shared-memory region for the tensors of one message at a time."""

    def __init__(self, descriptor: int, size: int) -> None:
        self.descriptor = descriptor
        self.size = size
        self.buffer = mmap.mmap(descriptor, size) if size else None

    @classmethod
    def create(cls, size: int) -> Arena:
        """A new region of ``size`` bytes (an anonymous memory file: no path to guess)."""
        descriptor = os.memfd_create("ptxgym-outputs", os.MFD_CLOEXEC)
        os.ftruncate(descriptor, size)
        return cls(descriptor, size)

    def share(self, conn: Connection, pid: int) -> None:
        """Hand the region to the process ``pid`` at the other end of ``conn``."""
        send_handle(conn, self.descriptor, pid)

    @classmethod
    def attach(cls, conn: Connection, size: int) -> Arena:
        """The region handed over on ``conn`` (see ``share``)."""
        return cls(recv_handle(conn), size)

    def close(self) -> None:
        """Close the descriptor and unmap; a mapping still viewed by tensors is unmapped when
        the last of them goes."""
        if self.buffer is not None:
            with contextlib.suppress(BufferError):
                self.buffer.close()
            self.buffer = None
        os.close(self.descriptor)


def arena_bytes(sizes: list[int]) -> int:
    """Arena size that holds tensors of ``sizes`` bytes, each at an aligned offset."""
    return sum(-(-size // _ALIGNMENT) * _ALIGNMENT for size in sizes)


def send(
    conn: Connection,
    header: dict[str, Any],
    tensors: dict[str, torch.Tensor] | None = None,
    arena: Arena | None = None,
) -> None:
    """Send a JSON header and, optionally, ``tensors``: copied into ``arena`` when one is given,
    else as raw frames after the header."""
    import torch

    frames = []
    layout = []
    offset = 0
    for name, tensor in (tensors or {}).items():
        flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
        item: dict[str, Any] = {
            "name": name,
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
        }
        if arena is None:
            frames.append(flat.cpu().numpy())
        else:
            nbytes = flat.numel()
            if offset + nbytes > arena.size:
                raise ValueError(f"tensor {name!r} does not fit in the arena ({arena.size} bytes)")
            if nbytes:
                destination = torch.frombuffer(
                    arena.buffer, dtype=torch.uint8, count=nbytes, offset=offset
                )
                destination.copy_(flat)
            item["offset"] = offset
            offset += arena_bytes([nbytes])
        layout.append(item)
    conn.send_bytes(json.dumps({**header, "tensors": layout}).encode())
    for frame in frames:
        conn.send_bytes(frame)


def receive(
    conn: Connection, arena: Arena | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Receive one message; tensors come back on the CPU. Tensors placed in ``arena`` are views
    of it, valid until the sender writes its next message: copy them before answering."""
    import torch

    try:
        header = json.loads(conn.recv_bytes(MAX_HEADER_BYTES))
    except (OSError, ValueError) as exc:
        raise ChannelError(f"malformed message header: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("tensors", []), list):
        raise ChannelError("message header is not an object with a tensor list")
    tensors = {}
    for item in header.pop("tensors", []):
        try:
            name, dtype, shape = (
                str(item["name"]),
                str(item["dtype"]),
                [int(s) for s in item["shape"]],
            )
        except (KeyError, TypeError, ValueError):
            raise ChannelError("malformed tensor description") from None
        if dtype not in _DTYPES or any(s < 0 for s in shape):
            raise ChannelError(f"tensor {name!r}: unsupported dtype {dtype!r} or shape {shape}")
        torch_dtype = getattr(torch, dtype)
        count = 1
        for size in shape:
            count *= size
        expected = count * torch.empty((), dtype=torch_dtype).element_size()
        if "offset" in item:
            flat = _from_arena(arena, name, item["offset"], expected)
        else:
            frame = conn.recv_bytes(MAX_FRAME_BYTES)
            if len(frame) != expected:
                raise ChannelError(f"tensor {name!r}: {len(frame)} bytes, expected {expected}")
            flat = (
                torch.frombuffer(bytearray(frame), dtype=torch.uint8)
                if frame
                else torch.empty(0, dtype=torch.uint8)
            )
        tensors[name] = flat.view(torch_dtype).reshape(shape)
    return header, tensors


def _from_arena(arena: Arena | None, name: str, offset: Any, nbytes: int) -> torch.Tensor:
    """The ``nbytes`` at ``offset`` of the arena, once the description is checked."""
    import torch

    if arena is None or arena.buffer is None:
        raise ChannelError(f"tensor {name!r} names an arena offset, but there is no arena")
    if not isinstance(offset, int) or offset < 0 or offset % _ALIGNMENT:
        raise ChannelError(f"tensor {name!r}: bad arena offset {offset!r}")
    if offset + nbytes > arena.size:
        raise ChannelError(f"tensor {name!r}: {nbytes} bytes at {offset} pass the arena's end")
    if not nbytes:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(arena.buffer, dtype=torch.uint8, count=nbytes, offset=offset)
