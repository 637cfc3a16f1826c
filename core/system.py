"""What machine and libraries a result came from. Cheap: reads package metadata and /proc, imports nothing heavy."""

from __future__ import annotations

import functools
import os
import platform
from importlib import metadata

#: Distributions whose versions every sidecar and report records (with, between the two groups, the
#: runtime packages each artifact format of the table names: ``Format.packages``).
TRACKED_LIBRARIES = ("ptopt", "torch", "numpy")
TRACKED_AFTER_FORMATS = ("torchao", "torchserve", "torch-model-archiver")


def tracked_libraries() -> list[str]:
    from ptopt.core.formats import targets

    runtimes = [p for row in targets().values() for p in row.packages]
    return list(dict.fromkeys([*TRACKED_LIBRARIES, *runtimes, *TRACKED_AFTER_FORMATS]))


#: CPU features that decide int8 speed (VNNI / AMX run int8 dot products natively).
ISA_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


def package_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that matter to an artifact (missing ones are left out)."""
    out = {"python": platform.python_version()}
    for dist in tracked_libraries():
        v = package_version(dist)
        if v is not None:
            out[dist] = v
    return out


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, str | None, frozenset[str]]:
    """(model name, vendor id, flags) of the first CPU in /proc/cpuinfo."""
    model, vendor, flags = platform.processor() or platform.machine(), None, frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key == "vendor_id" and vendor is None:
                    vendor = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
    except OSError:
        pass
    return model, vendor, flags


def cpu_flags() -> frozenset[str]:
    """Every cpuinfo flag of this CPU (``ptopt.core.isa`` decides CPU levels from them)."""
    return _cpuinfo()[2]


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict[str, object]:
    """CPU model and vendor, the ISA flags that matter for int8, and core counts."""
    model, vendor, flags = _cpuinfo()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return {
        "model": model,
        "vendor": vendor,
        "arch": platform.machine(),
        "logical_cores": os.cpu_count() or 1,
        "usable_cores": usable,
        "isa": {flag: flag in flags for flag in ISA_FLAGS},
    }


def machine_summary() -> dict[str, object]:
    """One dict that heads every report and benchmark table."""
    return {
        "cpu": cpu_info(),
        "os": f"{platform.system()} {platform.release()}",
        "hostname": platform.node(),
        "versions": library_versions(),
    }
