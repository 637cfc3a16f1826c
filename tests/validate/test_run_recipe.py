"""``ptopt run recipe.yaml``: validate-only recipes (the other twins live in other stages), vars,
references to earlier steps, and every step checked before the first runs."""

import json

import pytest
import yaml

from ptopt.core.errors import UsageError
from tests.helpers import assert_refused
from tests.validate.conftest import FACTORY


def _recipe(tmp_path, steps, vars_=None, name="recipe.yaml"):
    path = tmp_path / name
    body = {"version": 1, "steps": steps}
    if vars_:
        body["vars"] = vars_
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _validate_step(fixture, **more):
    return {
        "validate": {
            "reference": "${ref}",
            "artifacts": ["${art}"],
            "data": str(fixture["data"]),
            "batch_sizes": [1],
            "threads": 1,
            "min_iters": 3,
            "min_seconds": 0.01,
            "rounds": 2,
            **more,
        }
    }


def test_validate_only_recipe_with_vars_and_step_refs(cli, artifacts, tmp_path):
    steps = [
        _validate_step(artifacts, id="first", json_path="${out}/first.json", max_accuracy_drop=1.0),
        _validate_step(
            artifacts, json_path="${out}/second-${first.passed}.json", artifacts=["${art}", "${other}"]
        ),
    ]
    path = _recipe(
        tmp_path, steps, {"ref": FACTORY, "art": str(artifacts["onnx"]), "out": str(tmp_path / "wrong")}
    )
    code, out, err = cli(
        "run", path, "--var", f"out={tmp_path}", "--var", f"other={artifacts['torchscript']}"
    )
    assert code == 0, err
    assert "2 step(s) done" in out and out.count("ptopt validate — PASSED") == 2
    first = json.loads((tmp_path / "first.json").read_text())
    assert first["gates"]["max_accuracy_drop"] == 1.0 and first["artifacts"][0]["name"] == "tiny.onnx"
    second = json.loads((tmp_path / "second-True.json").read_text())
    assert [e["name"] for e in second["artifacts"]] == ["tiny.onnx", "tiny.ts.pt"]


def test_recipe_gate_failure_exits_1_and_stops(cli, artifacts, tmp_path):
    steps = [
        _validate_step(artifacts, max_size_mb=1e-9, markdown_path=str(tmp_path / "a.md")),
        _validate_step(artifacts, markdown_path=str(tmp_path / "b.md")),
    ]
    code, out, err = cli("run", _recipe(tmp_path, steps, {"ref": FACTORY, "art": str(artifacts["onnx"])}))
    assert code == 1 and "step 1 (validate)" in err and "max-size-mb" in err
    assert (tmp_path / "a.md").is_file() and not (tmp_path / "b.md").exists()


def test_python_twin_run_recipe(artifacts, tmp_path):
    from ptopt.pipeline import run_recipe

    path = _recipe(
        tmp_path, [_validate_step(artifacts, id="v")], {"ref": FACTORY, "art": str(artifacts["onnx"])}
    )
    results = run_recipe(path)
    assert results[0].value.passed and results[0].outputs["passed"] is True
    assert results[0].options["artifacts"] == [str(artifacts["onnx"])]


def _missing_twin(ok, artifacts, monkeypatch):
    """The step's twin is not installed (here: the command table points at a module that does not exist)."""
    import dataclasses

    from ptopt.commands import COMMANDS

    broken = dataclasses.replace(COMMANDS["quantize"], twin="ptopt.compress.no_such_module:quantize")
    monkeypatch.setitem(COMMANDS, "quantize", broken)
    return [ok, {"quantize": {"model": FACTORY, "mode": "dynamic", "output": "q.pt"}}]


#: case -> (steps of the recipe, or its text; what the one error line says)
BAD_RECIPES = {
    "missing-twin": (_missing_twin, "is not available in this installation"),
    "unknown-command": (lambda ok, a, m: [ok, {"compile": {"model": FACTORY}}], "unknown command 'compile'"),
    "undefined-ref": (
        lambda ok, a, m: [ok, _validate_step(a, artifacts=["${nothing.output}"])],
        "${nothing.output} is not defined",
    ),
    "bad-option": (lambda ok, a, m: [ok, _validate_step(a, max_acc_drop=1)], "max_acc_drop"),
    "ref-to-later-step": (
        lambda ok, a, m: [ok, _validate_step(a, artifacts=["${later}"]), {"validate": {"id": "later"}}],
        "${later} is not defined",
    ),
    "bad-attr": (
        lambda ok, a, m: [
            {"validate": {**ok["validate"], "id": "v"}},
            _validate_step(a, artifacts=["${v.output}"]),
        ],
        "a validate step offers passed",
    ),
    "duplicate-id": (
        lambda ok, a, m: [{"validate": {**ok["validate"], "id": "ref"}}],
        "id 'ref' is already used",
    ),
    "bad-when": (lambda ok, a, m: [{"validate": {**ok["validate"], "when": "yes"}}], "when: 'yes'"),
    "undefined-ref-in-title": (
        lambda ok, a, m: [{"validate": {**ok["validate"], "title": "${nope}"}}],
        "${nope} is not defined",
    ),
    "unknown-config-type": (
        lambda ok, a, m: [{"prune": {"model": FACTORY, "config": {"type": "prune-random", "amount": 0.5}}}],
        "config: unknown config type 'prune-random'",
    ),
    **{  # a value of the wrong type or outside the choices, a missing file: refused before any step runs
        case: (lambda ok, a, m, step=step: [ok, step(a)], expect)
        for case, (step, expect) in {
            "quoted-word-for-a-flag": (
                lambda a: _quantize(per_channel="maybe"),
                "step 2 (quantize): per_channel: 'maybe' is not true or false",
            ),
            "word-for-a-count": (
                lambda a: _quantize(calibration_batches="two"),
                "calibration_batches: 'two' is not a whole number",
            ),
            "word-for-a-number": (
                lambda a: _validate_step(a, min_cosine="high"),
                "step 2 (validate): min_cosine: 'high' is not a number",
            ),
            "unknown-mode": (
                lambda a: _quantize(mode="statik"),
                "mode: 'statik' is not one of dynamic, static",
            ),
            "number-for-a-target": (
                lambda a: {"export": {"model": FACTORY, "target": 5, "output": "m.onnx"}},
                "target: 5 is not one of torchscript, onnx",
            ),
            "missing-model-file": (
                lambda a: _quantize(model="models/nothere.pt"),
                "model: models/nothere.pt: no such file",
            ),
            "missing-data-file": (
                lambda a: _validate_step(a, data="nothere.npz"),
                "step 2 (validate): data: nothere.npz: no such file",
            ),
            "ray-folder-not-empty": (
                lambda a: {"package": {"artifact": str(a["onnx"]), "format": "ray", "output": "."}},
                "-o .: a Ray Serve package is a new folder, and this one exists and is not empty",
            ),
            "unknown-key-lists-the-flag-names": (
                lambda a: {"optimize": {"model": FACTORY, "output": "o", "batch_sizez": [1]}},
                "unknown key 'batch_sizez' (it takes: model, ",
            ),
        }.items()
    },
    "best-of-a-step-that-is-not-validate": (  # quoted as written, not as the path it would become
        lambda ok, a, m: [
            {"export": {"id": "e", "model": FACTORY, "target": "onnx", "output": "m.onnx"}},
            {"package": {"artifact": "${e.best}", "format": "mar", "output": "m.mar"}},
        ],
        "step 2 (package): ${e.best}: an export step offers output, path, format, precision",
    ),
    "not-yaml": ("steps: [unclosed", "not valid YAML"),
    "no-steps": ("version: 1\nsteps: []\n", "no steps"),
    "step-not-a-mapping": ("version: 1\nsteps: [validate]\n", "step 1 must be one mapping"),
    "unknown-top-level-key": (
        "version: 1\nstep: []\nsteps: [{validate: {}}]\n",
        "unknown top-level key(s) step",
    ),
    "future-version": ("version: 99\nsteps: [{validate: {}}]\n", "version 99 is not one this ptopt reads"),
    "not-utf8": (b"version: 1\nsteps: []  # caf\xe9\n", "not UTF-8 text"),
}


def _quantize(**more):
    return {"quantize": {"model": FACTORY, "mode": "static", "calib_data": "builtin:digits:train",
                         "output": "q.pt", **more}}  # fmt: skip


@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)], ids=["run", "dry-run"])
@pytest.mark.parametrize("case", list(BAD_RECIPES), ids=list(BAD_RECIPES))
def test_bad_recipe_exits_2_before_any_step_runs(cli, artifacts, tmp_path, monkeypatch, case, dry_run):
    make, expect = BAD_RECIPES[case]
    ok = _validate_step(artifacts, json_path=str(tmp_path / "ran.json"))  # fine, but must never run
    if isinstance(make, (str, bytes)):
        path = tmp_path / "recipe.yaml"
        path.write_bytes(make if isinstance(make, bytes) else make.encode())
    else:
        path = _recipe(
            tmp_path, make(ok, artifacts, monkeypatch), {"ref": FACTORY, "art": str(artifacts["onnx"])}
        )
    assert_refused(cli, "run", path, *dry_run, match=expect, where=tmp_path)


def test_validate_save_recipe_replays(cli, artifacts, tmp_path):
    recipe = tmp_path / "saved.yaml"
    code, out, err = cli(
        "validate",
        FACTORY,
        artifacts["onnx"],
        "--data",
        artifacts["data"],
        "--batch-sizes",
        "1",
        "--threads",
        "1",
        "--min-iters",
        "3",
        "--min-seconds",
        "0.01",
        "--rounds",
        "2",
        "--save-recipe",
        recipe,
    )
    assert code == 0, err
    step = yaml.safe_load(recipe.read_text())["steps"][0]["validate"]
    assert (
        step["reference"] == FACTORY
        and step["artifacts"] == [str(artifacts["onnx"])]
        and "progress" not in step
    )
    code, out, err = cli("run", recipe)
    assert code == 0 and "1 step(s) done" in out, err


def test_dry_run_checks_and_prints_the_plan(cli, artifacts, tmp_path):
    path = _recipe(
        tmp_path,
        [_validate_step(artifacts, json_path=str(tmp_path / "r.json"))],
        {"ref": FACTORY, "art": str(artifacts["onnx"])},
    )
    code, out, err = cli("run", path, "--dry-run")
    assert code == 0 and "1 step(s) OK (dry run" in out and FACTORY in out and str(artifacts["onnx"]) in out
    assert not (tmp_path / "r.json").exists()


def test_example_workflow_and_recipe_are_valid():
    """The GitHub Actions example parses and its recipe passes the static checks."""
    from pathlib import Path

    from ptopt.pipeline import plan

    root = Path(__file__).resolve().parents[2] / "examples" / "github-actions"
    wf = yaml.safe_load((root / "ptopt-gate.yml").read_text())
    job = next(iter(wf["jobs"].values()))
    text = json.dumps(job["steps"])
    assert "--max-accuracy-drop 1.0" in text  # accuracy against the fp32 model
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert (
        '"base-build/$a" "build/$a"' in runs and "--min-speedup 0.87" in runs
    )  # latency against the base commit
    recipe = yaml.safe_load((root / "validate-recipe.yaml").read_text())
    steps, _ = plan(recipe, {"artifacts": ["a.onnx"]})
    assert steps[0].command == "validate"


def _readme_recipes():
    """Every ```yaml block of the README and docs/ that is a recipe (has `steps`)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = "\n".join(
        p.read_text(encoding="utf-8") for p in [root / "README.md", *sorted(root.glob("docs/*.md"))]
    )
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S)]
    return [b for b in blocks if isinstance(b, dict) and "steps" in b]


def test_readme_recipes_are_complete_and_pass_the_pre_check():
    """The recipes of the README and docs parse and pass the runner's checks (commands, options, ${...}), so they
    cannot rot; the pipeline one chains quantize -> export -> validate."""
    from ptopt.core.recipe import check_recipe
    from ptopt.pipeline import plan

    recipes = _readme_recipes()
    assert len(recipes) >= 2
    for recipe in recipes:
        steps, _ = plan(check_recipe(recipe, "README"))
        assert steps and all(s.options for s in steps)
    commands = [[s.command for s in plan(r)[0]] for r in recipes]
    assert ["quantize"] in commands and ["quantize", "export", "validate"] in commands


def test_when_skips_a_step_and_empties_its_outputs(cli, artifacts, tmp_path):
    steps = [
        _validate_step(artifacts, id="first", when="${run_first}", json_path=str(tmp_path / "first.json")),
        _validate_step(artifacts, json_path=str(tmp_path / "second-${first.passed}.json")),
    ]
    vars_ = {"ref": FACTORY, "art": str(artifacts["onnx"]), "run_first": False}
    code, out, err = cli("run", _recipe(tmp_path, steps, vars_))
    assert code == 0, err
    assert "step 1 (validate, id first): skipped (when: ${run_first} is False)" in out
    assert not (tmp_path / "first.json").exists() and (tmp_path / "second-None.json").is_file()
    assert "2 step(s) done" in out and out.count("ptopt validate — PASSED") == 1


def test_a_step_config_mapping_is_the_config_it_names(cli, tmp_path):
    """``config: {type: ..., ...}`` (as Config.to_dict and sidecars write it) reaches the twin as
    that Config: the config registry is what reads recipes' configs."""
    out = tmp_path / "pruned.pt"
    cfg = {"type": "prune-global", "amount": 0.25, "exclude": ["fc"]}
    step = {"prune": {"model": FACTORY, "config": cfg, "input_shapes": ["2x1x8x8"], "output": str(out)}}
    code, _, err = cli("run", _recipe(tmp_path, [step]))
    assert code == 0, err
    config = json.loads(out.with_name(out.name + ".ptopt.json").read_text())["config"]
    assert (config["type"], config["amount"], config["exclude"]) == ("prune-global", 0.25, ["fc"])


def test_a_var_of_the_wrong_type_is_refused_before_any_step_runs(cli, artifacts, tmp_path):
    """``--var cos=abc`` for ``min_cosine: ${cos}``: the vars are known up front, so is the value."""
    steps = [_validate_step(artifacts, json_path=str(tmp_path / "ran.json"), min_cosine="${cos}")]
    path = _recipe(tmp_path, steps, {"ref": FACTORY, "art": str(artifacts["onnx"]), "cos": 0.9})
    for dry_run in ((), ("--dry-run",)):
        assert_refused(
            cli, "run", path, "--var", "cos=abc", *dry_run,
            match="step 1 (validate): min_cosine: 'abc' is not a number", where=tmp_path,
        )  # fmt: skip


def test_best_feeds_a_later_step_as_the_best_artifacts_path(cli, artifacts, tmp_path):
    """``${ID.best}`` where a step reads a file is the best artifact's path (``${ID.best_path}``); in a
    title it stays its name."""
    steps = [
        _validate_step(artifacts, id="v"),
        _validate_step(
            artifacts, title="again: ${v.best}", artifacts=["${v.best}"], json_path=str(tmp_path / "2.json")
        ),
    ]
    code, out, err = cli("run", _recipe(tmp_path, steps, {"ref": FACTORY, "art": str(artifacts["onnx"])}))
    assert code == 0, err
    assert [e["ref"] for e in json.loads((tmp_path / "2.json").read_text())["artifacts"]] == [
        str(artifacts["onnx"])
    ]


def test_recipe_keys_are_the_flags_names_and_values_read_as_the_flags_read_them(cli, tmp_path):
    """``--save-recipe`` writes each option under its flag's name (``per_tensor: true``); the recipe
    replays; a quoted ``"false"`` is false and ``"2"`` is 2 (as the flags read them), never a string
    that counts as true."""
    from ptopt.core.artifact import Artifact

    args = ("quantize", FACTORY, "--mode", "static", "--calib-data", "builtin:digits:train")
    code, _, err = cli(
        *args, "--calibration-batches", "2", "--per-tensor", "-o", "a.pt", "--save-recipe", "r.yaml", "-q"
    )
    assert code == 0, err
    step = yaml.safe_load((tmp_path / "r.yaml").read_text())["steps"][0]["quantize"]
    assert step["per_tensor"] is True and "per_channel" not in step and step["calibration_batches"] == 2
    assert Artifact.load(tmp_path / "a.pt").config["per_channel"] is False
    del step["per_tensor"]
    step |= {"per_channel": "false", "calibration_batches": "2", "output": "b.pt"}
    code, out, err = cli("run", _recipe(tmp_path, [{"quantize": step}], name="b.yaml"))
    assert code == 0, err
    config = Artifact.load(tmp_path / "b.pt").config
    assert config["per_channel"] is False and config["calibration_batches"] == 2


def test_input_shape_is_the_flags_name_for_input_shapes():
    from ptopt.pipeline import plan

    step = {"model": FACTORY, "method": "global", "amount": 0.5, "input_shape": ["2x1x8x8"], "output": "p.pt"}
    (planned,), _ = plan({"steps": [{"prune": step}]})
    assert planned.options["input_shapes"] == ["2x1x8x8"] and "input_shape" not in planned.options
    with pytest.raises(UsageError, match="input_shape and input_shapes are one option"):
        plan({"steps": [{"prune": step | {"input_shapes": ["2x1x8x8"]}}]})
