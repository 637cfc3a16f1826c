"""JUnit XML for CI test reporters: one test case per artifact × gate (``classname`` the artifact,
``name`` the gate), a ``<failure>`` for each failed gate; an artifact without gates gets one passing
case. The machine and versions go in the suite's properties."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from typing import Any

from ptopt.core.atomic import write_text_atomic
from ptopt.validate.reports.facts import data_line, machine_line, versions_line


def render(data: dict[str, Any]) -> str:
    cases = []
    for e in data["artifacts"]:
        gates = e.get("gates") or []
        if not gates:
            cases.append((e["name"], "validated", None, "no gates set", False))
        for g in gates:
            failure = None if g["passed"] or g.get("inconclusive") else g["message"]
            cases.append((e["name"], g["gate"], failure, g["message"], bool(g.get("inconclusive"))))
        lineage = e.get("lineage") or {}
        if lineage.get("verdict") == "other" and not any(g["gate"] == "lineage" for g in gates):
            made = (lineage.get("chain") or ["?"])[-1]
            warning = f"warning: made from {made} (its sidecar), not from {data['reference']['name']}"
            cases.append((e["name"], "lineage", None, warning, False))
    failures = sum(1 for c in cases if c[2] is not None)
    skipped = sum(1 for c in cases if c[4])
    suites = ET.Element(
        "testsuites",
        name="ptopt validate",
        tests=str(len(cases)),
        failures=str(failures),
        errors="0",
        time=f"{data.get('elapsed_s', 0):.2f}",
    )
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="ptopt.validate",
        tests=str(len(cases)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{data.get('elapsed_s', 0):.2f}",
        timestamp=str(data.get("created", "")),
    )
    props = ET.SubElement(suite, "properties")
    for k, v in (
        ("machine", machine_line(data)),
        ("versions", versions_line(data)),
        ("data", data_line(data)),
        ("reference", data["reference"]["name"]),
        ("accuracy_drop", data["accuracy_drop"]["definition"]),
    ):
        ET.SubElement(props, "property", name=k, value=v)
    for artifact, gate, failure, message, inconclusive in cases:
        case = ET.SubElement(suite, "testcase", classname=f"ptopt.validate.{artifact}", name=gate, time="0")
        if failure is not None:
            f = ET.SubElement(case, "failure", message=failure, type="GateFailed")
            f.text = f"{artifact}: {gate}: {failure}"
        elif inconclusive:  # within the timing noise: neither a pass nor a failure
            ET.SubElement(case, "skipped", message=message)
        else:
            ET.SubElement(case, "system-out").text = message
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write(data: dict[str, Any], path: str | os.PathLike) -> None:
    write_text_atomic(path, render(data))
