"""A message channel that never unpickles what the other side sends.

The judge (trusted) talks to workers that run candidate code (untrusted). Unpickling bytes from
an untrusted process would let it run code in the judge, so messages are JSON headers followed by
raw tensor frames, each size-checked, and tensors are rebuilt from bytes with their declared
dtype and shape. A receiver may give a message a deadline: it then never waits longer for the
message to arrive whole, however its sender stalls (after a frame's length, say).

Large outputs go through an ``Arena`` instead of the pipe: a shared-memory region the judge
creates for one evaluation and hands to the worker as a file descriptor. The worker copies a
message's tensors into it and names their offsets in the header; the judge checks that every
tensor lies inside the region, that no two overlap and no name comes twice, and reads them
there. Both sides take turns (the worker writes into the region again only after the judge
answered the message that used it), and the region holds nothing but the worker's own outputs,
so no name or path from the worker is ever opened. Once the judge has copied a message's
tensors out, it zeroes what it read (``Arena.wipe``) before it answers: a later message that
names the same offsets without writing them finds zeros, not outputs it could pass off as new.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import select
import struct
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MAX_HEADER_BYTES = 1 << 20
MAX_FRAME_BYTES = 16 << 30
_DTYPES = ("bfloat16", "float32", "int32", "float16", "int64", "int8", "float8_e4m3fn")


_ALIGNMENT = 256  # each tensor's offset in an arena: aligned for any dtype and for fast copies


class ChannelError(RuntimeError):
    """The other side sent something that is not a well-formed message."""


class ChannelTimeout(ChannelError):
    """A message did not arrive whole before its deadline."""


class Arena:
    """A shared-memory region for the tensors of one message at a time."""

    def __init__(self, descriptor: int, size: int) -> None:
        self.descriptor = descriptor
        self.size = size
        self.buffer = mmap.mmap(descriptor, size) if size else None
        # (offset, bytes) of each tensor ``receive`` read here since the last ``wipe``.
        self.read_extents: list[tuple[int, int]] = []
        # The region's address while CUDA has it page-locked (``pin``), else None.
        self.pinned_at: int | None = None

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

    def wipe(self) -> None:
        """Zero every extent read since the last wipe: call it once the tensors read there
        were copied out (they are views of the region), before answering their sender."""
        import torch

        if self.buffer is not None:
            for offset, nbytes in self.read_extents:
                torch.frombuffer(
                    self.buffer, dtype=torch.uint8, count=nbytes, offset=offset
                ).zero_()
        self.read_extents.clear()

    def pin(self) -> bool:
        """Page-lock this process's mapping of the region for CUDA (``cudaHostRegister``), so
        that copies between it and the GPU are direct DMA rather than staged through a bounce
        buffer: several times faster for the 128-MB outputs of a GEMM, whose copies the judge
        and the worker make while the GPU is held. Each side pins its own mapping; a refusal
        leaves the region pageable (slower copies, the same bytes). Whether it is pinned."""
        import torch

        if self.buffer is None or self.pinned_at is not None or not torch.cuda.is_available():
            return self.pinned_at is not None
        view = ctypes.c_char.from_buffer(self.buffer)
        address = ctypes.addressof(view)
        del view  # the mapping must stay closable: keep the address, not an export of it
        if int(torch.cuda.cudart().cudaHostRegister(address, self.size, 0)) != 0:
            return False
        self.pinned_at = address
        return True

    def close(self) -> None:
        """Unpin, close the descriptor and unmap; a mapping still viewed by tensors is unmapped
        when the last of them goes."""
        if self.pinned_at is not None:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.pinned_at)
            self.pinned_at = None
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
    conn: Connection, arena: Arena | None = None, timeout_s: float | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Receive one message; tensors come back on the CPU. With ``arena``, every tensor must lie
    in it, and comes back as a view of it, valid until the sender writes its next message: copy
    them, then ``arena.wipe()``, before answering. With ``timeout_s``, the whole message must
    arrive within that many seconds (else ChannelTimeout). EOFError when the other end closed
    the channel."""
    import torch

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        header = json.loads(_frame(conn, MAX_HEADER_BYTES, deadline))
    except ValueError as exc:
        raise ChannelError(f"malformed message header: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("tensors", []), list):
        raise ChannelError("message header is not an object with a tensor list")
    tensors = {}
    taken: list[tuple[int, int]] = []  # the extents of this message's tensors in the arena
    for item in header.pop("tensors", []):
        try:
            name, dtype, shape = str(item["name"]), str(item["dtype"]), item["shape"]
        except (KeyError, TypeError):
            raise ChannelError("malformed tensor description") from None
        # Whole numbers only, each no larger than a frame may be (torch refuses larger ones
        # with errors of its own).
        if (
            dtype not in _DTYPES
            or not isinstance(shape, list)
            or not all(type(size) is int and 0 <= size <= MAX_FRAME_BYTES for size in shape)
        ):
            raise ChannelError(
                f"tensor {name[:80]!r}: unsupported dtype {dtype[:40]!r} or shape {str(shape)[:80]}"
            )
        if name in tensors:
            raise ChannelError(f"tensor {name!r} is described twice")
        torch_dtype = getattr(torch, dtype)
        count = 1
        for size in shape:
            count *= size
        expected = count * torch.empty((), dtype=torch_dtype).element_size()
        if "offset" in item:
            flat = _from_arena(arena, name, item["offset"], expected, taken)
        elif arena is not None:
            # A frame the sender might never send: with an arena, there are none.
            raise ChannelError(f"tensor {name[:80]!r} is not in the arena")
        else:
            frame = _frame(conn, MAX_FRAME_BYTES, deadline)
            if len(frame) != expected:
                raise ChannelError(f"tensor {name!r}: {len(frame)} bytes, expected {expected}")
            flat = (
                torch.frombuffer(bytearray(frame), dtype=torch.uint8)
                if frame
                else torch.empty(0, dtype=torch.uint8)
            )
        tensors[name] = flat.view(torch_dtype).reshape(shape)
    return header, tensors


def _frame(conn: Connection, limit: int, deadline: float | None) -> bytes:
    """One frame as ``Connection.send_bytes`` writes it (its length, 4 bytes, big-endian; or -1
    and then 8 bytes), at most ``limit`` bytes, read whole before ``deadline``."""
    (size,) = struct.unpack("!i", _read(conn, 4, deadline))
    if size == -1:
        (size,) = struct.unpack("!Q", _read(conn, 8, deadline))
    if not 0 <= size <= limit:
        raise ChannelError(f"a frame of {size} bytes (at most {limit})")
    return _read(conn, size, deadline)


def _read(conn: Connection, size: int, deadline: float | None) -> bytes:
    """``size`` bytes from ``conn``; EOFError if the other end closed the channel first (its
    process ended, within a message or not), ChannelTimeout if ``deadline``
    (``time.monotonic``) passes first."""
    data = bytearray()
    while len(data) < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([conn.fileno()], [], [], remaining)[0]:
                raise ChannelTimeout("no whole message before the deadline")
        chunk = os.read(conn.fileno(), min(size - len(data), 1 << 24))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


def _from_arena(
    arena: Arena | None, name: str, offset: Any, nbytes: int, taken: list[tuple[int, int]]
) -> torch.Tensor:
    """The ``nbytes`` at ``offset`` of the arena, once the description is checked against the
    arena and against ``taken``, the extents of the message's tensors before it (extended)."""
    import torch

    if arena is None or arena.buffer is None:
        raise ChannelError(f"tensor {name!r} names an arena offset, but there is no arena")
    if type(offset) is not int or offset < 0 or offset % _ALIGNMENT:
        raise ChannelError(f"tensor {name!r}: bad arena offset {offset!r}")
    if offset + nbytes > arena.size:
        raise ChannelError(f"tensor {name!r}: {nbytes} bytes at {offset} pass the arena's end")
    if not nbytes:
        return torch.empty(0, dtype=torch.uint8)
    if any(start < offset + nbytes and offset < start + size for start, size in taken):
        raise ChannelError(f"tensor {name!r} overlaps another tensor of the message")
    taken.append((offset, nbytes))
    arena.read_extents.append((offset, nbytes))
    return torch.frombuffer(arena.buffer, dtype=torch.uint8, count=nbytes, offset=offset)
