"""The JSON report of either command (validate: one document per run, one entry per artifact, schema in
docs/validate.md; optimize: ``report.json``, docs/optimize.md). Non-finite numbers become null so any
JSON parser reads it."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ptopt.core.atomic import write_text_atomic


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(_clean(data), indent=2) + "\n"


def write(data: dict[str, Any], path: str | os.PathLike) -> None:
    write_text_atomic(path, dumps(data))
