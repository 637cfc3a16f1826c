"""The optimize reports (report.json, report.html, summary.md, the terminal table) on hand-built report
dicts: no model is built, so these run in a couple of seconds."""

from __future__ import annotations

import base64
import io
import json
import math
import re
import shlex

import pytest

from ptopt.optimize import report as R
from ptopt.optimize.pareto import pareto_front
from tests.optimize.report_fixtures import (
    cosine_report,
    no_winner_report,
    single_report,
    v1_report,
    winner_report,
)

NO_WINNER = "NO CANDIDATE MEETS THE BUDGET"


def _png_of(page: str) -> bytes:
    m = re.search(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert m, "no embedded PNG"
    return base64.b64decode(m.group(1))


def _names(report):
    return [c["name"] for c in report["candidates"]]


def test_html_has_the_plot_every_candidate_and_the_budget(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    report = winner_report()
    R.write_html(report, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    png = _png_of(page)
    img = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert img.shape[0] > 200 and img.shape[1] > 300
    for name in _names(report):
        assert f">{name}<" in page
    assert "accuracy drop ≤ 1 points of top-1" in page
    assert "best: int8-onnx-qdq" in page and "2.64x fp32 eager at batch 32" in page
    # the failed and the skipped candidate have no numbers: named under the plot, not drawn
    assert "Not in the plot (no numbers): dynamic-int8, int8-autoquant" in page
    # written inside the output folder (often a staging folder renamed afterwards): a relative path
    assert "(from the output folder): <code>ptopt package best.onnx --format mar -o model.mar</code>" in page
    assert not [p for p in tmp_path.iterdir() if p.name != "report.html"]  # no temp file left


def test_markdown_table_and_winner_line(tmp_path):
    report = winner_report()
    R.write_markdown(report, tmp_path / "summary.md", directory="runs/opt")
    text = (tmp_path / "summary.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(report["candidates"])  # the header + one row per candidate
    assert rows[0].split(" | ")[1:4] == ["candidate", "format / runtime", "precision"]
    winner_row = next(r for r in rows if "int8-onnx-qdq" in r)
    # the drop with its unit, as validate spells it
    assert winner_row.startswith(
        "| ★ | **`int8-onnx-qdq`** | onnx / onnxruntime (ort) | int8 | 0.339 | 99.11 | +0.33 pts |"
    )
    assert "13.830 | 2.64x" not in winner_row  # per-batch columns: ms @1, ms @32, then speedups
    assert "| 0.590 | 13.830 | 6.10x | 2.64x | kept |" in winner_row
    assert "rejected: accuracy drop 2.10 points > 1 allowed" in text
    assert "failed: RuntimeError: cannot fuse conv \\| relu" in text  # a | in a reason does not break the row
    assert text.startswith("### ✅ ptopt optimize: best: int8-onnx-qdq")
    line = next(x for x in text.splitlines() if x.startswith("Package it"))
    assert "`ptopt package runs/opt/best.onnx --format mar -o model.mar`" in line
    assert "Winner: `int8-onnx-qdq`" in text
    assert "quantize --mode static --engine ort → export --target onnx --precision int8" in text


def test_the_package_command_is_one_ptopt_package_accepts(tmp_path):
    """The line names the real command's options: ARTIFACT, --format mar, -o OUT.mar."""
    from ptopt.cli.package import command

    cmd = R.package_command(winner_report(), tmp_path)
    argv = shlex.split(cmd)[2:]
    ctx = command.make_context("package", argv, resilient_parsing=True)
    assert ctx.params["artifact"] == str(tmp_path / "best.onnx")
    assert ctx.params["format"] == "mar" and ctx.params["output"] == "model.mar"


def test_terminal_table_exact_numbers_status_and_noise():
    out = R.render_terminal(winner_report(), "out", width=300)  # wide: no status wraps
    for name in _names(winner_report()):
        assert name in out
    assert "13.830" in out and "2.64x" in out and "0.590" in out
    assert "rejected: accuracy drop 2.10 points > 1 allowed" in out
    assert "skipped: the model has no Linear/LSTM/GRU layer worth it" in out
    assert "21.210~" in out  # noisy: flagged by the engine (and its rounds spread 31 %)
    for bs in ("1", "32"):  # one footnote per batch size, validate's spelling
        assert (
            f"~ noisy: fp32-onnx at batch {bs}: the timing rounds spread 31% (IQR of the round medians)"
            in out
        )
    assert "ptopt package out/best.onnx --format mar -o model.mar" in out
    assert "\x1b[" not in out  # plain text: the CLI decides about colour
    ref_row = [x.strip() for x in next(line for line in out.splitlines() if "fp32-eager" in line).split("│")]
    # the reference: marked, and no speedup of its own
    assert ref_row[1] == "ref" and ref_row[-4:-2] == ["ref", "ref"]
    bare = R.render_terminal(winner_report())  # the CLI may print the package line itself
    # its row in each table the 100 columns wrap the candidates table into, and the verdict
    assert "ptopt package" not in bare and bare.count("int8-onnx-qdq") == bare.count("┏") + 1


@pytest.mark.parametrize("best_found", [True, False], ids=["best-found", "nothing-kept"])
def test_exit_1_is_said_loudly_everywhere(tmp_path, best_found):
    pytest.importorskip("matplotlib")
    report = no_winner_report(best_found)
    R.write_html(report, tmp_path / "report.html")
    R.write_markdown(report, tmp_path / "summary.md")
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    md = (tmp_path / "summary.md").read_text(encoding="utf-8")
    term = R.render_terminal(report, tmp_path)
    for text in (page, md, term):
        assert NO_WINNER in text and "accuracy drop ≤ 0.1 points of top-1" in text
    assert "<h1 class='loud'>" in page and md.startswith("### ❌")
    if best_found:
        assert "the best found, int8-fx, does NOT meet it (exit 1)" in term
        assert "Best found (outside the budget: check it before you ship it): `int8-fx`" in md
        assert "`ptopt package best.pt --format mar" in md
    else:
        assert "No artifact to package" in md and "No artifact to package" in term
        assert "ptopt package" not in md


def test_cosine_budget_reports(tmp_path):
    pytest.importorskip("matplotlib")
    report = cosine_report()
    R.write_html(report, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "min cosine vs fp32" in page and _png_of(page).startswith(b"\x89PNG")
    assert "worst-sample cosine vs fp32 ≥ 0.99" in page
    assert R.budget_threshold(report) == 0.99
    head = R.table_head(report)
    assert "top-1 %" not in head and "cos min" in head
    assert "0.997800" in R.render_terminal(report)


def test_cosine_budget_reports_the_projection_beside_the_measured_worst():
    """With projections (``worst_cosine`` in the report): two cosine columns, the plot's y and the budget
    line on the projection, a note saying which is which; a report from before them renders as it was."""
    report = cosine_report()
    report["worst_cosine"] = {"reference_samples": 1000, "judged_on": "projected"}
    for c in report["candidates"]:
        if c.get("cosine_min") is not None:
            c["cosine_projected"] = round(1 - 7.5 * (1 - c["cosine_min"]), 6)
            c["tail"] = {"measured": c["cosine_min"], "projected": c["cosine_projected"], "samples": 32}
    assert R.table_head(report)[5:7] == ["cos min", "cos proj"]
    best = R.best_candidate(report)
    assert R.y_value(report, best) == best["cosine_projected"] < best["cosine_min"]
    assert "projected to 1000 samples" in R.budget_line(report) and "projected to 1000" in R.y_label(report)
    md = R.render_markdown(report)
    assert "cos proj: that worst projected to 1000 samples" in md
    assert (
        f"; worst cosine {best['cosine_min']:.4f} measured on 32 samples ({best['cosine_projected']:.4f} projected to 1000"
        in md
    )
    assert "cos proj" not in R.render_terminal(cosine_report())  # a report from before projections


def test_null_numbers_everywhere_do_not_crash(tmp_path):
    report = no_winner_report(best_found=False)
    for c in report["candidates"]:
        for k in ("latency_ms", "speedup", "accuracy", "accuracy_drop", "cosine_min", "size_bytes", "steps"):
            c[k] = None
    report["elapsed_s"] = report["time_budget_s"] = report["ranking_batch_size"] = None
    R.write_html(report, tmp_path / "report.html")  # nothing to plot: no matplotlib needed
    R.write_markdown(report, tmp_path / "summary.md")
    R.write_json(report, tmp_path / "report.json")
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Nothing to plot" in page and "data:image/png" not in page
    assert "| — |" in (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "—" in R.render_terminal(report)


def test_single_candidate_and_an_aoti_winner(tmp_path):
    pytest.importorskip("matplotlib")
    report = single_report()
    R.write_html(report, tmp_path / "report.html")
    assert _png_of((tmp_path / "report.html").read_text(encoding="utf-8")).startswith(b"\x89PNG")
    md = R.render_markdown(report, "out")
    assert "It is the eager model itself" in md  # an eager winner has no file of its own to serve
    report["candidates"][0].update(format="aoti", runtime="aoti", path="candidates/fp32-aoti.pt2")
    md = R.render_markdown(report, "out")
    # an AOTInductor package is served as it is, with the consent its native code needs
    assert "`ptopt package out/best.pt2 --format mar -o model.mar --allow-pickle`" in md
    assert "TorchScript first" not in md and "--format triton" in md
    # Triton is offered only where the format's row serves there (an OpenVINO IR: TorchServe only)
    report["candidates"][0].update(format="openvino", runtime="openvino", path="candidates/int8-openvino.xml")
    md = R.render_markdown(report, "out")
    assert "`ptopt package out/best.xml --format mar -o model.mar`" in md and "--format triton" not in md
    report["candidates"][0].update(format="mystery", packageable=False)
    md = R.render_markdown(report, "out")
    assert "exports this mystery artifact to TorchScript first" in md
    assert "--allow-pickle" not in md


def test_json_is_the_report_with_non_finite_numbers_as_null(tmp_path):
    report = winner_report()
    report["candidates"][0]["speedup"]["1"] = math.inf
    R.write_json(report, tmp_path / "report.json")
    back = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert back["candidates"][0]["speedup"]["1"] is None
    back["candidates"][0]["speedup"]["1"] = math.inf
    assert back == report


@pytest.mark.parametrize(
    ("points", "front"),
    [
        ([(1.0, 90.0, "a")], ["a"]),
        ([(1.0, 90.0, "a"), (2.0, 95.0, "b"), (3.0, 94.0, "c"), (0.5, 80.0, "d")], ["d", "a", "b"]),
        ([(1.0, 90.0, "a"), (1.0, 92.0, "b")], ["b"]),
    ],
    ids=["one", "dominated-dropped", "same-latency"],
)
def test_pareto_front(points, front):
    assert [p[2] for p in pareto_front(points)] == front


def test_a_candidate_wide_noisy_flag_lands_where_the_speedup_is_within_the_spread():
    """The engine flags a candidate; the tables mark the batch sizes where |speedup - 1| is within the
    combined spread of the candidate's and the reference's rounds (and any spread over 25 %)."""
    report = winner_report()
    c = next(c for c in report["candidates"] if c["name"] == "int8-fx")
    c["noisy"] = True
    c["latency_ms"]["1"]["spread_pct"] = 20.0  # 4.35x: far outside 20 % → not noisy at batch 1
    c["latency_ms"]["32"]["spread_pct"] = 24.0
    c["speedup"]["32"] = 1.2  # 1.2x: within hypot(24, 4) % → noisy at batch 32
    assert not R.is_noisy(report, c, "1") and R.is_noisy(report, c, "32")
    row = R.table_row(report, c)
    assert "0.828" in row and "20.200~" in row and "1.20x~" in row
    assert R.noise_notes(report)[-1] == (
        "~ noisy: int8-fx at batch 32: its speedup 1.20x is within the combined spread of its and the "
        "reference's timing rounds (24%): speedups at this batch size are not meaningful"
    )
    c["noisy"] = {"1": True, "32": False}  # a per-batch-size flag is taken as it is
    assert R.is_noisy(report, c, "1") and not R.is_noisy(report, c, "32")


def test_the_machine_is_described_as_validate_describes_it(tmp_path):
    """One machine line and one versions line for both commands, from the same machine_summary() dict."""
    pytest.importorskip("matplotlib")
    from ptopt.validate.reports import facts

    report = winner_report()
    as_validate = {"machine": report["machine"], "threads": 2, "device": "cpu"}
    line, versions = facts.machine_line(as_validate), facts.versions_line(as_validate)
    assert line == "AMD EPYC (x86_64, 2 usable of 2 cores; ISA: avx2, fma); Linux 6.18.44; threads: 2"
    assert R.machine_line(report) == line and R.versions_line(report) == versions
    R.write_html(report, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert f"Machine: {line}<br>Versions: {versions}<br>" in page
    assert f"<sub>{line} · {versions}</sub>" in R.render_markdown(report)
    term = R.render_terminal(report, width=300)
    assert f"machine:  {line}\nversions: {versions}\nsearch:   model zoo:resnet" in term


def test_a_v1_report_still_renders(tmp_path):
    """report.json of ptopt.optimize/1 carried a reduced machine dict: its CPU, ISA, threads and versions
    still print, in the same line."""
    report = v1_report()
    assert R.machine_line(report) == "AMD EPYC (ISA: avx2, fma); threads: 2"
    assert R.versions_line(report) == "ptopt 0.1.0, torch 2.13.0"
    term = R.render_terminal(report, width=300)
    assert "machine:  AMD EPYC (ISA: avx2, fma); threads: 2\nversions: ptopt 0.1.0, torch 2.13.0" in term
    assert "AMD EPYC (ISA: avx2, fma); threads: 2 · ptopt 0.1.0, torch 2.13.0" in R.render_markdown(report)


def test_the_fastest_per_batch_size_is_printed_when_it_differs():
    from ptopt.optimize.report import render_markdown, render_terminal

    rep = winner_report()
    best = rep["best"]
    other = next(
        c["name"]
        for c in rep["candidates"]
        if c["status"] == "kept" and c["name"] not in (best, "fp32-eager")
    )
    rep["best_by_batch"] = {
        "1": {"name": other, "speedup": 3.5, "path": f"candidates/{other}.onnx"},
        "32": {"name": best, "speedup": 2.0, "path": "best.onnx"},
    }
    ref = rep["reference"]
    line = (
        f"Fastest within the budget per batch size: batch 1: {other}, 3.50x {ref}, opt/candidates/{other}.onnx; "
        f"batch 32: {best}, 2.00x {ref}, opt/best.onnx."
    )
    assert line in render_terminal(rep, directory="opt", width=400)
    assert f"batch 1: `{other}`" in render_markdown(rep)
    rep["best_by_batch"]["1"] = dict(rep["best_by_batch"]["32"])  # the same winner everywhere: no line
    assert "per batch size" not in render_terminal(rep, directory="opt", width=400)


def test_a_winner_within_the_noise_is_named_with_its_caveat():
    """The winner is the fastest by the medians; where the timing cannot tell it from the next fastest
    within the budget (validate's ★ rule, ``validate.noise.clear_lead``), the headline says so. It used
    to print the speedup alone, with 13 of 22 cells noisy."""
    report = winner_report()
    assert "not a clear lead" not in R.headline(report)  # 13.83 ms against 20.20 ms, rounds within 4%
    best = R.best_candidate(report)
    best["latency_ms"]["32"]["median"] = 19.9  # 1.5% ahead of int8-fx's 20.20 ms
    line = R.headline(report)
    assert "not a clear lead over int8-fx: its lead (2%) is within the combined spread" in line
    assert "time it again on a quiet machine" in line and line.index("at batch 32") < line.index(
        "not a clear"
    )
    best["latency_ms"]["32"]["spread_pct"] = 60.0
    assert "not a clear lead: its own timing rounds spread 60%" in R.headline(report)


def test_a_busy_machine_is_said_in_every_report(tmp_path):
    report = winner_report()
    report["timing_noise"] = {"noisy_cells": 7, "cells": 12, "retimed": 1, "busy": True}
    busy = "The machine was busy: 7 of 12 timings noisy after 1 more timing(s)"
    assert busy in R.render_terminal(report)
    R.write_markdown(report, tmp_path / "summary.md")
    R.write_html(report, tmp_path / "report.html")
    assert busy in (tmp_path / "summary.md").read_text() and busy in (tmp_path / "report.html").read_text()
    report["timing_noise"] = {"noisy_cells": 7, "cells": 12, "retimed": 0, "busy": True}
    assert "noisy (no time left to time again)" in R.render_terminal(report)
    report["timing_noise"]["busy"] = False
    assert "machine was busy" not in R.render_terminal(report)


def test_a_noisy_reference_makes_the_headline_and_the_timing_noisy():
    """Every speedup divides by the reference's median: ``best: ... 5.32x fp32-eager at batch 16`` rested on a
    reference whose rounds spread 148%, with ``busy: False`` and no caveat. The headline now says so, and the
    search counts the reference's noise in every speedup cell at that batch size (``speedup_cells``)."""
    from ptopt.optimize.search import speedup_cells

    report = winner_report()
    assert "~" not in R.headline(report)  # the winner's lead is clear, the reference's rounds within 4%
    R.reference_candidate(report)["latency_ms"]["32"]["spread_pct"] = 148.0
    line = R.headline(report)
    assert "the speedup divides by the reference fp32-eager, whose timing rounds spread 148%" in line
    assert "not a clear lead" not in line and "time it again on a quiet machine" in line
    report["timing_noise"] = {
        "noisy_cells": 6,
        "cells": 12,
        "retimed": 1,
        "busy": False,
        "reference_noisy": [32],
    }
    assert "The reference's timing was noisy at batch size(s) 32" in R.render_terminal(report)

    def st(spread):
        return {"p50_ms": 1.0, "round_spread_pct": spread}

    # the reference noisy at batch 16, every candidate clean: each speedup cell at 16 is noisy, so the run is busy
    stats = [{1: st(3.0), 16: st(148.0)}, {1: st(3.0), 16: st(2.0)}, {1: st(4.0), 16: st(5.0)}]
    assert speedup_cells(stats) == (3, 6)
    assert speedup_cells([{16: st(148.0)}, {16: st(2.0)}, {16: st(5.0)}]) == (3, 3)  # busy: 3 > half of 3


def test_a_long_reason_is_cut_at_a_word_with_an_ellipsis():
    """A rejection's reason was cut mid-word at 300 characters with no mark ("... a lower worst-sample
    cosine is wit"): the record keeps up to 1000, the status cell 400, each cut at a word, with "…"."""
    from ptopt.optimize.report import STATUS_CHARS, fmt_status
    from ptopt.optimize.search import _first_line

    reason = _first_line(
        ValueError("the outputs no longer follow the source's: " + "within " * 200 + "\nmore")
    )
    assert 300 < len(reason) <= 1000 and reason.endswith("within…") and "more" not in reason
    cell = fmt_status({"status": "rejected", "reason": reason})
    assert len(cell) <= STATUS_CHARS and cell.startswith("rejected: the outputs") and cell.endswith("within…")
    assert fmt_status({"status": "rejected", "reason": "short"}) == "rejected: short"
