"""CPU levels: run an artifact here as a CPU with fewer instruction sets would run it.

The kernel libraries under every runtime pick their code from the CPU they find when they start, and
most of them read an environment variable that caps that choice (each reads it once, at start-up: a
level therefore runs in a child process started with the variables set, ``ptopt.validate.isa``):

| library | variable | used by |
| --- | --- | --- |
| oneDNN | ``ONEDNN_MAX_CPU_ISA`` | torch convolutions, int8 (x86/onednn), PT2E int8 ops; OpenVINO's CPU plugin |
| ATen | ``ATEN_CPU_CAPABILITY`` | torch's vectorised kernels (element-wise, softmax, norms); Inductor's codegen |
| MKL | ``MKL_ENABLE_INSTRUCTIONS`` | torch fp32 matrix products (Linear, matmul); honoured on Intel CPUs only |
| FBGEMM | ``FBGEMM_ENABLE_INSTRUCTIONS`` | torch int8 Linear (x86/fbgemm engines); nothing below avx2 (it needs avx2) |
| MLAS | none | ONNX Runtime's CPU kernels; OpenVINO's fp32 FullyConnected: their own CPU dispatch |

A runtime therefore follows a level fully, partly or not at all (``Format.isa_libraries`` names the
libraries of each format; ``coverage`` says which of them a level caps). An AOTInductor package's
generated kernels were compiled for one instruction set when the package was built: a cap at run time
does not change them (only the library calls inside follow it), and a CPU below that instruction set
cannot run them at all.

The names users type are ``LEVELS`` (lowest first) plus ``native`` (no cap). A level this CPU does not
reach cannot be emulated (a cap only lowers): ``check_levels`` refuses it in one line. The highest level
this CPU reaches is what it runs without a cap, so that level is measured natively, in this process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

from ptopt.core.errors import UsageError
from ptopt.core.system import ISA_FLAGS as INT8_FLAGS

NATIVE = "native"


@dataclasses.dataclass(frozen=True)
class Library:
    """A kernel library: its name in reports, and the variable that caps it (None: it has none)."""

    label: str
    env: str | None
    #: where the cap is honoured only on one vendor's CPUs (cpuinfo ``vendor_id``)
    vendor: str | None = None


LIBRARIES = {
    "onednn": Library("oneDNN", "ONEDNN_MAX_CPU_ISA"),
    "aten": Library("ATen", "ATEN_CPU_CAPABILITY"),
    "mkl": Library("MKL", "MKL_ENABLE_INSTRUCTIONS", vendor="GenuineIntel"),
    "fbgemm": Library("FBGEMM", "FBGEMM_ENABLE_INSTRUCTIONS"),
    "mlas": Library("MLAS", None),
    "inductor": Library("Inductor-generated kernels", None),
    "gpu": Library("the GPU", None),
}
#: every variable a level sets; a child process starts with none of them but its level's
CAP_VARIABLES = tuple(lib.env for lib in LIBRARIES.values() if lib.env)


@dataclasses.dataclass(frozen=True)
class Level:
    """One CPU level: the cpuinfo flags a CPU needs to be at it, and each library's cap there (a library
    missing from ``caps`` cannot be capped at this level)."""

    name: str
    label: str
    requires: tuple[str, ...]
    caps: dict[str, str]

    def env(self) -> dict[str, str]:
        """The variables that cap every library that can be capped at this level."""
        return {LIBRARIES[lib].env: value for lib, value in self.caps.items()}


_X86 = ("sse4_1",)
_AVX2 = (*_X86, "avx", "avx2", "fma")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq")
#: the levels users name, lowest first (the order the highest reachable one is found in)
LEVELS = {
    lv.name: lv
    for lv in (
        Level("sse41", "SSE4.1", _X86, {"onednn": "SSE41", "aten": "default", "mkl": "SSE4_2"}),
        Level("avx", "AVX", (*_X86, "avx"), {"onednn": "AVX", "aten": "default", "mkl": "AVX"}),
        Level("avx2", "AVX2", _AVX2, {"onednn": "AVX2", "aten": "avx2", "mkl": "AVX2", "fbgemm": "AVX2"}),
        Level("avx2_vnni", "AVX2 + AVX-VNNI", (*_AVX2, "avx_vnni"),
              {"onednn": "AVX2_VNNI", "aten": "avx2", "mkl": "AVX2_E1", "fbgemm": "AVX2"}),
        Level("avx512", "AVX-512", _AVX512,
              {"onednn": "AVX512_CORE", "aten": "avx512", "mkl": "AVX512", "fbgemm": "AVX512"}),
        Level("avx512_vnni", "AVX-512 VNNI", (*_AVX512, "avx512_vnni"),
              {"onednn": "AVX512_CORE_VNNI", "aten": "avx512", "mkl": "AVX512_E1", "fbgemm": "AVX512_E1"}),
        Level("avx512_bf16", "AVX-512 VNNI + BF16", (*_AVX512, "avx512_vnni", "avx512_bf16"),
              {"onednn": "AVX512_CORE_BF16", "aten": "avx512", "mkl": "AVX512_E3", "fbgemm": "AVX512_E1"}),
        Level("amx", "AMX (int8, bf16)", (*_AVX512, "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8",
                                         "amx_bf16"),
              {"onednn": "AVX512_CORE_AMX", "aten": "avx512", "mkl": "AVX512_E4", "fbgemm": "AVX512_E1"}),
    )
}  # fmt: skip


#: the cpuinfo flags of int8 dot-product instructions
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_dot_products() -> bool:
    """Whether this process's int8 kernels have dot-product instructions (VNNI or AMX). Without them x86
    int8 kernels sum u8 x s8 pairs into saturating 16-bit lanes, so int8 activations are kept to 7 bits
    there. A process whose oneDNN is capped at a level without them (``ONEDNN_MAX_CPU_ISA=AVX2``: running
    as a lower CPU would) has none, whatever the CPU: PT2E's int8 kernels are oneDNN's, and an 8-bit
    package of a small test model built under that cap drifted (worst-sample cosine 0.70; 0.993 with
    7-bit activations)."""
    return not onednn_capped_without(INT8_DOT_FLAGS) and bool(set(INT8_DOT_FLAGS) & cpu_flags())


#: the cpuinfo flags of the levels where OpenVINO's CPU plugin runs bf16 when asked to: AVX-512 and up,
#: emulated where the CPU lacks avx512_bf16, or AVX2-VNNI-2 (its ``hasHardwareSupport(bf16)``: oneDNN's
#: ``avx512_core`` or ``avx2_vnni_2``)
OPENVINO_BF16_FLAGS = ("avx512f", "avx_ne_convert")
#: ... and where it runs bf16 by default (asked for nothing): a CPU with bf16 instructions
OPENVINO_DEFAULT_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def openvino_bf16_capped_away(default: bool = False) -> bool:
    """Whether a oneDNN cap (``ONEDNN_MAX_CPU_ISA``) below the level where OpenVINO's CPU plugin runs bf16
    (asked for; ``default``: by default) took those kernels away in this process. The plugin (2026.4) picks
    bf16 from the CPU itself, not from the cap, and then finds no kernels (``Supported primitive descriptors
    list is empty``, zero output rows), where a CPU at that level runs f32: a capped process asks for f32,
    as that CPU gets. Uncapped: False (the plugin's own choice holds)."""
    return onednn_capped_without(OPENVINO_DEFAULT_BF16_FLAGS if default else OPENVINO_BF16_FLAGS)


#: oneDNN caps users may set that no level sets, with the cpuinfo flags of what they allow (a cap above
#: AVX512_CORE_BF16, the AVX10 and AMX ones, keeps every flag the rules here ask about)
ONEDNN_OTHER_CAPS = {"AVX2_VNNI_2": (*_AVX2, "avx_vnni", "avx_vnni_int8", "avx_ne_convert")}


def onednn_capped_without(flags: Iterable[str], cap: str | None = None) -> bool:
    """Whether this process's oneDNN is capped (``ONEDNN_MAX_CPU_ISA``; ``cap``: that value instead, a
    level's) so that it runs none of ``flags``: what the cap allows, on this CPU (a cap above the CPU leaves
    the CPU's own level)."""
    if cap is None:
        cap = os.environ.get(LIBRARIES["onednn"].env or "", "")
    cap = cap.strip().upper()
    allowed = {lv.caps["onednn"]: lv.requires for lv in LEVELS.values()} | ONEDNN_OTHER_CAPS
    if cap not in allowed:
        return False
    return not set(flags) & set(allowed[cap]) & cpu_flags()


def cpu_flags() -> set[str]:
    """This CPU's cpuinfo flags (empty where /proc/cpuinfo cannot be read)."""
    from ptopt.core import system

    return set(system.cpu_flags())


def reaches(level: str, flags: Iterable[str] | None = None) -> bool:
    """Whether a CPU with ``flags`` (default: this one) runs ``level``'s code."""
    if level == NATIVE:
        return True
    have = cpu_flags() if flags is None else set(flags)
    return set(LEVELS[level].requires) <= have


def top_level(flags: Iterable[str] | None = None) -> str | None:
    """The highest level a CPU with ``flags`` (default: this one) reaches (None: not even sse41)."""
    have = cpu_flags() if flags is None else set(flags)
    found = [name for name in LEVELS if reaches(name, have)]
    return found[-1] if found else None


def parse_levels(value: Any) -> list[str]:
    """``"avx2,amx"`` or a list -> the level names, duplicates dropped, in the order given; an unknown
    name is a UsageError listing the known ones."""
    if value is None:
        return []
    items = str(value).split(",") if isinstance(value, str) else [str(v) for v in value]
    names = [s.strip().lower() for s in items if s.strip()]
    known = [NATIVE, *LEVELS]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--isa {unknown[0]}: unknown CPU level (choose from {', '.join(known)})")
    if not names:
        raise UsageError(f"--isa {value!r}: name at least one CPU level ({', '.join(known)})")
    return list(dict.fromkeys(names))


def check_levels(value: Any, flags: Iterable[str] | None = None) -> list[str]:
    """``parse_levels``, then every level this CPU reaches (a cap only lowers what a CPU runs): a level
    above it is a UsageError naming what it lacks and the highest level it reaches."""
    levels = parse_levels(value)
    have = cpu_flags() if flags is None else set(flags)
    for name in levels:
        if not reaches(name, have):
            missing = [f for f in LEVELS[name].requires if f not in have]
            top = top_level(have)
            raise UsageError(
                f"--isa {name}: this CPU cannot run {LEVELS[name].label} code (it lacks {', '.join(missing)}); "
                f"a level can only be emulated on a CPU that has it: the highest here is {top or 'none'}"
            )
    return levels


def is_native(level: str, flags: Iterable[str] | None = None) -> bool:
    """Whether ``level`` runs exactly as this process does: ``native``, or this CPU's highest level with
    no cap inherited from the environment (then no child process is needed)."""
    if level == NATIVE:
        return True
    return level == top_level(flags) and not inherited_caps()


def inherited_caps() -> dict[str, str]:
    """The cap variables already set in this process's environment (they make "native" capped)."""
    return {k: os.environ[k] for k in CAP_VARIABLES if os.environ.get(k)}


def child_env(level: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process at ``level``: ``base`` (default: this one's) without any
    inherited cap, with the level's."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in CAP_VARIABLES}
    if level != NATIVE:
        env.update(LEVELS[level].env())
    return env


@dataclasses.dataclass(frozen=True)
class Coverage:
    """How far a runtime follows a level: the libraries the level caps for it, those it cannot cap
    (with why), and the verdict ``follows`` / ``partly`` / ``ignores``."""

    capped: tuple[str, ...]
    uncapped: tuple[tuple[str, str], ...]

    @property
    def verdict(self) -> str:
        if not self.uncapped:
            return "follows"
        return "partly" if self.capped else "ignores"

    def note(self, runtime: str, level: str) -> str:
        """One line for the report ('' when the runtime follows the level)."""
        if not self.uncapped:
            return ""
        why = "; ".join(f"{LIBRARIES[lib].label}: {reason}" for lib, reason in self.uncapped)
        if not self.capped:
            return f"{runtime} ignores the {level} cap ({why}): its figures would be this CPU's, so it is not run"
        kept = ", ".join(LIBRARIES[lib].label for lib in self.capped)
        return f"{runtime} follows the {level} cap partly: {kept} capped; {why}"

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "capped": list(self.capped), "uncapped": dict(self.uncapped)}


_UNCAPPED = {
    "inductor": "compiled for one instruction set when the artifact was built",
    "gpu": "it runs on the GPU",
}


def coverage(libraries: Sequence[str], level: str, vendor: str | None = None) -> Coverage:
    """Which of ``libraries`` (a format's ``isa_libraries``) ``level`` caps on a CPU of ``vendor``."""
    if level == NATIVE:
        return Coverage(tuple(libraries), ())
    lv = LEVELS[level]
    capped, uncapped = [], []
    for lib in libraries:
        row = LIBRARIES[lib]
        if row.env is None:
            reason = _UNCAPPED.get(lib, "no cap: it picks its code from the CPU itself")
            uncapped.append((lib, reason))
        elif lib not in lv.caps:
            uncapped.append((lib, f"no {lv.label} level: a CPU below avx2 cannot run it at all"))
        elif row.vendor and vendor and vendor != row.vendor:
            uncapped.append((lib, f"the cap works on {row.vendor} CPUs only (this one: {vendor})"))
        else:
            capped.append(lib)
    return Coverage(tuple(capped), tuple(uncapped))


#: Inductor's vector ISA (a word of ``AOTI_CPU_ISA``, lower case) -> the level a CPU needs to run its code
VEC_ISA_LEVELS = {"avx2": "avx2", "avx512": "avx512", "avx512_vnni": "avx512_vnni", "amx_tile": "amx"}


def vec_isa_level(compiled_for: str | None) -> str | None:
    """The level a CPU needs to run kernels Inductor compiled for ``compiled_for``: a package's
    ``AOTI_CPU_ISA`` names each extension of its ISA (``AVX512 AVX512_VNNI``, ``AVX512 AVX512_VNNI
    AMX_TILE``), so the highest one known counts. None for an unknown or scalar ISA."""
    known = [
        VEC_ISA_LEVELS[w]
        for w in str(compiled_for or "").lower().replace(",", " ").split()
        if w in VEC_ISA_LEVELS
    ]
    return max(known, key=lambda lv: len(LEVELS[lv].requires), default=None)


def vec_isa_reaches(compiled_for: str | None, level: str) -> bool:
    """Whether a CPU at ``level`` runs kernels Inductor compiled for ``compiled_for`` (an unknown or
    scalar ISA: yes)."""
    needed = vec_isa_level(compiled_for)
    if needed is None or level == NATIVE:
        return True
    return set(LEVELS[needed].requires) <= set(LEVELS[level].requires)


def cpu_record() -> dict[str, Any]:
    """What a sidecar records of the CPU an artifact was checked on: model, vendor, its int8-relevant
    flags and its highest level."""
    from ptopt.core.system import cpu_info

    info, flags = cpu_info(), cpu_flags()
    return {
        "model": info["model"],
        "vendor": info.get("vendor"),
        "int8_flags": [f for f in INT8_FLAGS if f in flags],
        "level": top_level(flags),
    }


def difference(recorded: dict[str, Any] | None, flags: Iterable[str] | None = None) -> str | None:
    """How this CPU's int8-relevant flags differ from the ``recorded`` CPU's (``cpu_record``), in words,
    or None when they do not (or nothing was recorded)."""
    if not recorded or "int8_flags" not in recorded:
        return None
    have = cpu_flags() if flags is None else set(flags)
    mine = {f for f in INT8_FLAGS if f in have}
    theirs = set(recorded["int8_flags"])
    if mine == theirs:
        return None
    parts = []
    if theirs - mine:
        parts.append(f"this CPU lacks {', '.join(f for f in INT8_FLAGS if f in theirs - mine)}")
    if mine - theirs:
        parts.append(
            f"it has {', '.join(f for f in INT8_FLAGS if f in mine - theirs)}, which that one had not"
        )
    return "; ".join(parts)


def mismatch_line(
    name: str, recorded: dict[str, Any] | None, recheck: str, flags: Iterable[str] | None = None
) -> str | None:
    """The one line printed when ``name`` was checked on a CPU whose int8-relevant flags differ from this
    one's (None when they do not): what differs, and the ``ptopt validate --isa`` command ``recheck``
    (with ``{level}`` for this CPU's level) that re-checks it."""
    why = difference(recorded, flags)
    if why is None:
        return None
    have = cpu_flags() if flags is None else set(flags)
    level = top_level(have) or NATIVE
    where = recorded.get("model") or "another CPU"
    return (
        f"{name} was checked on {where} (level {recorded.get('level') or '?'}); {why}: its int8/bf16 kernels "
        f"differ here. Re-check it for this CPU: {recheck.format(level=level)}"
    )


def sensitive(fmt: str | None, precision: str | None) -> bool:
    """Whether an artifact's numbers depend on the CPU's int8 / bf16 instructions: int8 and weight-only
    precisions, half precisions (OpenVINO's bf16 kernels), and compiled AOTInductor kernels."""
    return precision in ("int8", "int4", "bf16", "fp16") or fmt == "aoti_package"


#: artifacts whose mismatch line this process already printed
_ANNOUNCED: set[str] = set()


def check_moved(path: Any, art: Any, recheck: str | None = None) -> str | None:
    """The line for an artifact (``art``: its sidecar's Artifact) checked on a CPU whose int8-relevant
    flags differ from this one's (None when they do not, or when its numbers do not depend on them);
    ``recheck``: the re-check command (default: ``ptopt validate REFERENCE PATH --data DATA --isa
    {level}``)."""
    if art is None or not sensitive(art.format, art.precision):
        return None
    command = recheck or f"ptopt validate REFERENCE {path} --data DATA --isa {{level}}"
    return mismatch_line(str(path), getattr(art, "cpu", None), command)


def announce(path: Any, line: str | None) -> None:
    """Print ``line`` on stderr, once per artifact per process."""
    import sys

    key = str(path)
    if line and key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        print(line, file=sys.stderr, flush=True)
