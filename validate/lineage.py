"""Lineage: was an artifact made from the model it is validated against?

Every artifact ptopt writes records its parent in its sidecar (``{"path", "sha256", "format"}``; a
``zoo:NAME`` or ``pkg.module:factory`` reference as its path, with ``weights``). validate follows that
chain, parent by parent (a parent file's own sidecar names the next one; a relative path is looked up
from the working folder, then from the child's folder), and the reference's own chain the same way.
Two models on the chains are the same when they are the same reference string with the same weights,
the same file or folder, or files with the same sha256. The verdict of each artifact:

- ``descends``: the reference is on the artifact's chain (quantized from it, exported from that, ...);
- ``related``: the two chains meet above both (siblings: an int8 and an ONNX export of one model);
- ``other``: the chains never meet: the artifact was made from another model. Its accuracy drop,
  agreement and speedup compare unrelated models, so every report says so, it is never ranked best,
  and ``--strict-lineage`` fails it (exit 1, a ``lineage`` gate);
- ``unknown``: nothing to follow (no sidecar, an in-memory model, a parent that is not here): in the
  JSON only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ptopt.core.errors import PtoptError

#: how many parents are followed (a real chain is a few long)
MAX_DEPTH = 16
HF = "hf:"


def lineage(
    parent: dict[str, Any] | None, artifact: Any, reference: Any, weights: Any = None
) -> dict[str, Any]:
    """``{"verdict", "chain"[, "why"]}`` of an artifact whose sidecar names ``parent``; ``artifact`` and
    ``reference`` (with its ``weights``) as validate was given them. ``chain``: the artifact's
    ancestors as their sidecars name them, nearest first."""
    if not _is_ref(reference):
        return {"verdict": "unknown", "chain": [], "why": "the reference is a model in memory"}
    if not parent or not parent.get("path"):
        return {"verdict": "unknown", "chain": [], "why": "no parent recorded"}
    start = Path(os.fspath(artifact)).parent if _is_ref(artifact) else Path.cwd()
    mine, complete = _chain(parent, start)
    ref_node = _node({"path": os.fspath(reference), "weights": _text(weights)}, Path.cwd())
    ref_found = _locate(os.fspath(reference), Path.cwd())
    theirs = [ref_node]
    if ref_found is not None and _parent_of(ref_found):
        theirs += _chain(_parent_of(ref_found), ref_found.parent)[0]
    names = [n["name"] for n in mine]
    if any(_meets(n, ref_node) for n in mine):
        return {"verdict": "descends", "chain": names}
    if any(_meets(a, b) for a in mine for b in theirs[1:]):
        return {"verdict": "related", "chain": names}
    if not complete:
        return {"verdict": "unknown", "chain": names, "why": f"{names[-1]} (a parent) is not here"}
    return {"verdict": "other", "chain": names}


def _chain(record: dict[str, Any] | None, here: Path) -> tuple[list[dict[str, Any]], bool]:
    """The nodes from ``record`` up, and whether the chain ended at a root (not at a missing file)."""
    nodes: list[dict[str, Any]] = []
    while record and record.get("path") and len(nodes) < MAX_DEPTH:
        node = _node(record, here)
        if any(_meets(node, n) for n in nodes):
            return nodes, True  # a loop: nothing more to learn
        nodes.append(node)
        found = node["found"]
        if found is None:
            return nodes, node["scheme"]  # zoo:NAME / pkg.module:factory is a root; a missing file is not
        record, here = _parent_of(found), found.parent
    return nodes, True


def _node(record: dict[str, Any], here: Path) -> dict[str, Any]:
    name = str(record["path"])
    found = _locate(name, here)
    keys = set()
    if _is_scheme(name):
        keys.add(("ref", name, _text(record.get("weights"))))
    if found is not None and found.is_file() and record.get("sha256") and _sha256(found) != record["sha256"]:
        found = None  # a file of that name, but not the bytes the sidecar recorded
    if found is not None:
        keys.add(("file", os.path.realpath(found)))
        if found.is_file():
            keys.add(("sha", record.get("sha256") or _sha256(found)))
    elif record.get("sha256"):
        keys.add(("sha", record["sha256"]))
    return {"name": name, "found": found, "scheme": _is_scheme(name), "keys": keys}


def _meets(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["keys"] & b["keys"])


def _text(weights: Any) -> str | None:
    if weights is None:
        return None
    p = Path(os.fspath(weights))
    return os.path.realpath(p) if p.exists() else os.fspath(weights)


def _is_ref(obj: Any) -> bool:
    return isinstance(obj, (str, os.PathLike))


def _is_scheme(name: str) -> bool:
    """A reference that names no file: ``zoo:NAME``, ``pkg.module:factory``."""
    from ptopt.core.modelref import FACTORY_RE, model_scheme

    if name.startswith(HF) or Path(name).exists():
        return False
    return model_scheme(name) is not None or bool(FACTORY_RE.match(name))


def _locate(name: str, here: Path) -> Path | None:
    """The file or folder a recorded path names: as written (from the working folder), else in ``here``."""
    text = name[len(HF) :] if name.startswith(HF) else name
    if _is_scheme(name) or text.startswith("<"):
        return None
    for p in (Path(text), here / text, here / Path(text).name):
        if p.exists():
            return p
    return None


def _sha256(path: Path) -> str:
    from ptopt.core.artifact import Artifact, sha256_file

    try:
        art = Artifact.maybe_load(path)
    except PtoptError:
        art = None
    return art.sha256 if art is not None and art.sha256 else sha256_file(path)


def _parent_of(path: Path) -> dict[str, Any] | None:
    from ptopt.core.artifact import Artifact

    try:
        art = Artifact.maybe_load(path)
    except PtoptError:
        return None
    return art.parent if art is not None else None


def flagged(entry: dict[str, Any]) -> bool:
    """An artifact made from another model than the reference (its ``lineage`` verdict)."""
    return (entry.get("lineage") or {}).get("verdict") == "other"


def note(name: str, found: dict[str, Any], reference: str, strict: bool) -> str:
    """The line every report prints for an artifact made from another model."""
    chain = found.get("chain") or ["?"]
    via = f" (via {', '.join(chain[:-1])})" if len(chain) > 1 else ""
    rule = "it fails --strict-lineage" if strict else "--strict-lineage fails it"
    return (
        f"lineage: {name} was made from {chain[-1]}{via} (its sidecar), not from the reference {reference}: "
        f"its drop, agreement and speedup compare different models; it is not ranked best, and {rule}"
    )


def check_entries(entries: list[Any], reference: Any, weights: Any, strict: bool) -> list[Any]:
    """Set each artifact entry's ``lineage`` (``entries[0]`` is the reference's); with ``strict``, an
    artifact made from another model gets a failed ``lineage`` gate. Returns those gate results."""
    from ptopt.validate.gates import GateResult

    results = []
    for e in entries[1:]:
        e.lineage = lineage(e.parent, e.ref, reference, weights)
        if strict and e.lineage["verdict"] == "other":
            made = e.lineage["chain"][-1]
            r = GateResult(
                e.name, "lineage", 0.0, None, False, f"made from {made}, not from {entries[0].name}"
            )
            e.gates.append(r.to_dict())
            e.passed = False
            results.append(r)
    return results


def notes(entries: list[Any], strict: bool) -> list[str]:
    """The report's line for every artifact made from another model (after ``check_entries``)."""
    return [note(e.name, e.lineage, entries[0].name, strict) for e in entries[1:] if flagged(e.to_dict())]
