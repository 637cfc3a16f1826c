"""``ptopt optimize --save-recipe`` and an optimize step of ``ptopt run``: the recipe keys are the
flags' names, and the step prints the search's summary as the command does. Kept fast as
tests/optimize/test_optimize.py is: tiny CNN, tiny data, two cheap candidates, short timing."""

from __future__ import annotations

import yaml

FACTORY = "tests.helpers:tiny_cnn"
FAST_CLI = (
    "--batch-size", "1,4", "--threads", "1", "--rounds", "2", "--min-seconds", "0.01", "--min-iters", "3",
)  # fmt: skip


def test_save_recipe_replays_and_the_step_prints_its_summary(cli, tmp_path):
    from ptopt.core.data import load_data

    load_data("builtin:digits:train").take(64).save(tmp_path / "calib.pt")
    load_data("builtin:digits:test").take(64).save(tmp_path / "eval.pt")
    code, out, err = cli(
        "optimize", FACTORY, "--calib-data", "calib.pt", "--eval-data", "eval.pt", "--min-cosine", "0.99",
        "--candidates", "fp32-onnx,int8-dynamic", *FAST_CLI, "-o", "opt", "--save-recipe", "r.yaml", "-q",
    )  # fmt: skip
    assert code == 0, err
    step = yaml.safe_load((tmp_path / "r.yaml").read_text())["steps"][0]["optimize"]
    assert step["batch_size"] == "1,4" and "batch_sizes" not in step and step["min_cosine"] == 0.99
    assert step["model"] == FACTORY and step["output"] == "opt"
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"steps": [{"optimize": step | {"output": "opt2"}}]}))
    code, out, err = cli("run", "r.yaml", "-q")
    assert code == 0, err
    # the table and the packaging hint, as `ptopt optimize` prints them, then where the best is
    assert "int8-dynamic" in out and "fp32-onnx" in out and "ptopt package" in out
    assert "step 1 (optimize): wrote opt2/best." in out
