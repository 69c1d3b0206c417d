"""A message channel that never unpickles what the other side sends.

The judge (trusted) talks to workers that run candidate code (untrusted). Unpickling bytes from
an untrusted process would let it run code in the judge, so messages are JSON headers followed by
raw tensor frames, each size-checked, and tensors are rebuilt from bytes with their declared
dtype and shape.
"""

from __future__ import annotations

import json
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MAX_HEADER_BYTES = 1 << 20
MAX_FRAME_BYTES = 16 << 30
_DTYPES = ("bfloat16", "float32", "int32", "float16", "int64")


class ChannelError(RuntimeError):
    """The other side sent something that is not a well-formed message."""


def send(
    conn: Connection, header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None
) -> None:
    """Send a JSON header and, optionally, CPU copies of ``tensors`` as raw frames."""
    frames = []
    layout = []
    for name, tensor in (tensors or {}).items():
        host = tensor.detach().contiguous().cpu()
        layout.append(
            {
                "name": name,
                "dtype": str(host.dtype).removeprefix("torch."),
                "shape": list(host.shape),
            }
        )
        frames.append(host.view(-1).view(dtype=_byte_dtype()).numpy().tobytes())
    conn.send_bytes(json.dumps({**header, "tensors": layout}).encode())
    for frame in frames:
        conn.send_bytes(frame)


def receive(conn: Connection) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Receive one message; tensors come back on the CPU."""
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


def _byte_dtype() -> Any:
    import torch

    return torch.uint8
