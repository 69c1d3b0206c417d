"""The catalogue of attack kernels in this folder: each ``<name>.cu`` and its header.

Every file begins with a block of ``//`` lines in a fixed form::

    // attack: what the kernel tries (one line)
    // expect: STATUS | STATUS            statuses any of which means the attack was stopped
    // stage: cpu | gpu                   cpu: the policy or the build decides; gpu: a run does
    // defended: yes (how) | no (issue 8) no: today's code is believed to let it through
    // max_speedup: 0.5                   optional, gpu: PASSED counts as stopped only at or
    //                                    below this speedup (the honest fallback is slow)
    // compile_timeout_s: 5               optional: the build deadline to evaluate it under
    // why: why the attack would pay, and why the expected status stops it
    //   (continuation lines are indented)

Sources may hold two placeholders, replaced when a test renders them: ``@SECRET_PATH@``, a file
whose only line is ``#define HOSTILE_SECRET "<random token>"`` (any read that succeeds can then
show the token), and ``@CANARY_PATH@``, a path the kernel writes when an escape succeeded.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from ptxgym.outcome import Status

HERE = Path(__file__).resolve().parent
SECRET_PLACEHOLDER = "@SECRET_PATH@"
CANARY_PLACEHOLDER = "@CANARY_PATH@"
FIELDS = ("attack", "expect", "stage", "defended", "max_speedup", "compile_timeout_s", "why")
REQUIRED = ("attack", "expect", "stage", "defended", "why")
CPU_STATUSES = frozenset({Status.FORMAT_ERROR, Status.POLICY_VIOLATION, Status.COMPILE_ERROR})
_FIELD_RE = re.compile(r"^//\s?(\w+):\s*(.*)$")


class HeaderError(ValueError):
    """A catalogue file whose header is not in the fixed form."""


@dataclass(frozen=True)
class Attack:
    """One attack kernel and what its header says about it."""

    name: str
    path: Path
    attack: str
    expect: frozenset[Status]
    stage: str
    defended: bool
    defended_note: str
    why: str
    max_speedup: float | None
    compile_timeout_s: float | None
    source: str

    def render(self, secret_path: Path | str, canary_path: Path | str) -> str:
        """The source with the placeholders replaced."""
        return self.source.replace(SECRET_PLACEHOLDER, str(secret_path)).replace(
            CANARY_PLACEHOLDER, str(canary_path)
        )


@dataclass(frozen=True)
class Secret:
    """A host file an attack must never read back: its path and the token it holds."""

    path: Path
    token: str


def make_secret(folder: Path) -> Secret:
    """Write a secret file with a fresh random token into ``folder``."""
    token = f"HOSTILE_SECRET_{secrets.token_hex(16)}"
    path = folder / f"secret_{secrets.token_hex(4)}.h"
    path.write_text(f'#define HOSTILE_SECRET "{token}"\n', encoding="utf-8")
    return Secret(path, token)


def parse_header(path: Path) -> dict[str, str]:
    """The header's fields; raises :class:`HeaderError` when it is not in the fixed form."""
    fields: dict[str, str] = {}
    last: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("//"):
            break
        if line.rstrip().endswith("\\"):
            raise HeaderError(f"{path.name}: a header line ends in a backslash (it would splice)")
        match = _FIELD_RE.match(line)
        if match and match.group(1) in FIELDS:
            key = match.group(1)
            if key in fields:
                raise HeaderError(f"{path.name}: field {key!r} appears twice")
            fields[key] = match.group(2).strip()
            last = key
        elif last is not None and line.startswith("//   "):
            fields[last] += " " + line[2:].strip()
        else:
            raise HeaderError(f"{path.name}: unexpected header line {line!r}")
    missing = [key for key in REQUIRED if not fields.get(key)]
    if missing:
        raise HeaderError(f"{path.name}: missing header field(s) {missing}")
    return fields


def load(path: Path) -> Attack:
    """Parse and validate one catalogue file."""
    fields = parse_header(path)
    try:
        expect = frozenset(Status(word.strip()) for word in fields["expect"].split("|"))
    except ValueError as exc:
        raise HeaderError(f"{path.name}: expect: {exc}") from None
    stage = fields["stage"]
    if stage not in ("cpu", "gpu"):
        raise HeaderError(f"{path.name}: stage must be cpu or gpu, not {stage!r}")
    if stage == "cpu" and not expect <= CPU_STATUSES:
        raise HeaderError(f"{path.name}: a cpu-stage attack may only expect {set(CPU_STATUSES)}")
    note = fields["defended"]
    if note.startswith("yes"):
        defended = True
    elif note == "no (issue 8)":
        defended = False
    else:
        raise HeaderError(f"{path.name}: defended must be 'yes (how)' or 'no (issue 8)'")
    max_speedup = float(fields["max_speedup"]) if "max_speedup" in fields else None
    if (Status.PASSED in expect) != (max_speedup is not None):
        raise HeaderError(f"{path.name}: expect PASSED exactly when max_speedup is given")
    timeout = fields.get("compile_timeout_s")
    return Attack(
        name=path.stem,
        path=path,
        attack=fields["attack"],
        expect=expect,
        stage=stage,
        defended=defended,
        defended_note=note,
        why=fields["why"],
        max_speedup=max_speedup,
        compile_timeout_s=float(timeout) if timeout else None,
        source=path.read_text(encoding="utf-8"),
    )


def catalogue_paths() -> list[Path]:
    return sorted(HERE.glob("*.cu"))


def load_all() -> list[Attack]:
    """Every attack in the folder, by name."""
    return [load(path) for path in catalogue_paths()]
