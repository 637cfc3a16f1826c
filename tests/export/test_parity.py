"""The parity rule (``ptopt.export.parity``): per output, an error within a tolerance relative to that
output's scale AND a minimum worst-sample cosine, for every format and precision."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from ptopt.core.errors import ParityError
from ptopt.core.inputspec import InputSpec, specs_from_example
from ptopt.export.parity import MIN_COSINE, check_parity, compare, judge, torch_runner
from ptopt.export.writers import Check, write_model
from tests.helpers import tiny_cnn


class Scaled(nn.Module):
    """A classifier whose outputs are ~1e-9 (what a badly scaled int8 model once returned)."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(x) * 1e-9


def _check(source, artifact, x, precision):
    specs = specs_from_example(x)
    return check_parity(
        torch_runner(source), torch_runner(artifact), specs, "positional", precision=precision, samples=None
    )


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_tiny_outputs_of_a_garbage_model_fail_at_every_precision(precision):
    """The old absolute tolerance (0.1 for int8) passed this: outputs ~1e-9, cosine ~0."""
    x = torch.randn(4, 16)
    with pytest.raises(ParityError, match=r"worst-sample cosine .* < ") as err:
        _check(Scaled(0).eval(), Scaled(1).eval(), x, precision)
    m = err.value.metrics
    assert not m["passed"] and m["worst_output"]["cosine"] < MIN_COSINE[precision]
    assert m["worst_output"]["max_abs_ref"] < 1e-7  # the numbers of the worst output are reported
    assert "output 0" in str(err.value) and "no tolerance makes this artifact right" not in str(err.value)


def test_tiny_outputs_of_the_same_model_pass():
    x = torch.randn(4, 16)
    m = _check(Scaled(0).eval(), Scaled(0).eval(), x, "fp32")
    assert m["passed"] and m["cosine"] > 0.9999999


def test_the_tolerance_follows_each_outputs_own_scale():
    """A small second output drifting by 50 % of its own scale fails, though it is tiny next to the
    first output (one tolerance over all outputs would have passed it)."""
    big = np.full((2, 4), 100.0)
    small = np.array([[1e-3, 2e-3], [3e-3, 1e-3]])
    m = compare([big, small], [big, small * 1.5], ["logits", "aux"])
    assert [o["output"] for o in m["outputs"]] == ["logits", "aux"]
    reasons = judge(m, atol=1e-6, rtol=0.1, min_cosine=0.99)
    assert len(reasons) == 1 and reasons[0].startswith("output aux")
    assert m["outputs"][1]["cosine"] == pytest.approx(1.0)  # same direction: only the tolerance catches it


def test_worst_sample_counts_not_the_average():
    ref = np.eye(8)[:, :4] + 0.01
    got = ref.copy()
    got[3] = -got[3]  # one sample of eight points the other way
    m = compare([ref], [got])
    assert m["outputs"][0]["worst_sample"] == 3 and m["cosine"] < 0
    assert m["outputs"][0]["mean_cosine"] > 0.5


def test_zero_samples_are_judged_by_the_tolerance_only():
    ref = np.array([[0.0, 0.0], [3.0, 4.0]])
    got = np.array([[1e-9, -1e-9], [3.0, 4.0]])
    m = compare([ref], [got])
    assert m["cosine"] == pytest.approx(1.0)
    assert not judge(m, atol=1e-6, rtol=1e-4, min_cosine=0.9999)


def test_a_faithful_int8_model_passes_the_int8_rule(tmp_path):
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    module = tiny_cnn().eval()
    calib = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    torch.backends.quantized.engine = "x86"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_fx(copy.deepcopy(module), get_default_qconfig_mapping("x86"), (calib[:2],))
        prepared(calib)
        q = convert_fx(prepared)
    # the int8 file against the fp32 source, on the calibration data: the int8 rule holds
    facts = write_model(
        q,
        "torchscript",
        tmp_path / "q.pt",
        example=calib[:2],
        check=Check(reference=module, samples=calib),
        precision="int8",
    )
    parity = facts["metrics"]["parity"]
    assert parity["passed"] and parity["min_cosine"] == MIN_COSINE["int8"] and parity["cosine"] > 0.99
    # ...and the fp32 rule, much tighter, does not: precision picks the rule
    with pytest.raises(ParityError, match="cosine|max abs diff"):
        write_model(q, "torchscript", tmp_path / "q32.pt", example=calib[:2], check=Check(module, calib))


def test_a_drift_within_the_cosine_minimum_suggests_looser_tolerances(tmp_path):
    module = tiny_cnn().eval()
    other = copy.deepcopy(module)
    with torch.no_grad():
        other.fc.weight.mul_(1.001)  # same direction, 0.1 % larger
    x = module.example_inputs(2)
    with pytest.raises(ParityError, match=r"loosen with --atol/--rtol"):
        write_model(module, "torchscript", tmp_path / "a.pt", example=x, check=Check(other))


# -- per-token outputs are judged at the real tokens of attention_mask --------------------------------


class _Encoder(nn.Module):
    """[N, T, 8] hidden states and [N, T] scores (as many as tokens: not per-token features)."""

    def __init__(self, noise: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 8)
        self.noise = noise

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        h = self.emb(input_ids)
        pad = (attention_mask == 0).unsqueeze(-1)
        garbage = torch.sin(h * 1000 + 1) * self.noise  # what a lossy runtime leaves at ignored positions
        return {"last_hidden_state": torch.where(pad, h + garbage, h), "scores": h.sum(-1)}


def _token_specs():
    ids = torch.randint(0, 50, (4, 6))
    mask = torch.ones(4, 6, dtype=torch.int64)
    mask[:, 4:] = 0
    return specs_from_example({"input_ids": ids, "attention_mask": mask})


def test_padded_positions_of_per_token_outputs_are_left_out():
    """all-MiniLM-L6-v2 to ONNX int8 (ort_dynamic) was refused at a worst-sample cosine of 0.646 on
    last_hidden_state, 0.951 on its real tokens: padding nothing reads decided the verdict."""
    specs = _token_specs()
    source, artifact = torch_runner(_Encoder().eval()), torch_runner(_Encoder(noise=5.0).eval())
    metrics = check_parity(source, artifact, specs, "keyword", precision="fp32")
    assert metrics["passed"] and metrics["cosine"] == pytest.approx(1.0)
    assert "padded position(s) of attention_mask left out" in metrics["shapes"]["opt"]["padding"]


def test_outputs_that_are_not_per_token_keep_every_position():
    """A [N, T] output (one score per token, or as many classes as tokens) is not masked."""

    class Scores(_Encoder):
        def forward(self, input_ids, attention_mask):
            out = super().forward(input_ids, attention_mask)
            garbage = torch.sin(out["scores"] * 1000) * self.noise * (attention_mask == 0)
            return {"scores": out["scores"] + garbage}

    specs = _token_specs()
    with pytest.raises(ParityError, match="output scores"):
        check_parity(torch_runner(Scores().eval()), torch_runner(Scores(noise=5.0).eval()), specs, "keyword")


def test_the_mask_of_a_dict_batch_is_read_by_name_not_by_the_specs_order():
    """Data whose keys come in another order than the specs (a tokenizer's dict beside a model
    signature's order) still masks at its attention_mask, not at whatever input stands in its slot."""
    from ptopt.export.parity import real_tokens

    specs = _token_specs()  # input_ids, attention_mask
    ids = torch.randint(1, 50, (4, 6))  # no id 0: read as a mask, every position would look real
    mask = torch.ones(4, 6, dtype=torch.int64)
    mask[:, 4:] = 0
    x = {"attention_mask": mask, "input_ids": ids}
    out = np.ones((4, 6, 8), dtype=np.float32)
    _, got, padded = real_tokens(specs, x, [out], [out.copy()])
    assert padded == 8
    assert not got[0][:, 4:].any() and got[0][:, :4].all()


def test_quantize_fidelity_judges_per_token_outputs_at_the_real_tokens_as_parity_does():
    """compress.fidelity (the int8 rule of quantize's held-out acceptance and engine search) follows
    export's parity: a model whose export passes was refused there on its padding's cosine."""
    from ptopt.compress.fidelity import measure_fidelity
    from ptopt.core.data import Dataset

    ids = torch.randint(0, 50, (8, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(8, 6, dtype=torch.int64)
    mask[:, 3:] = 0
    data = Dataset({"input_ids": ids, "attention_mask": mask}, name="tokens")
    fid = measure_fidelity(_Encoder().eval(), _Encoder(noise=5.0).eval(), data, precision="int8")
    assert fid["passed"] and fid["min_cosine"] == pytest.approx(1.0), fid


class _ZeroHead(nn.Module):
    """A random-init torchvision ViT's head starts at zero: every output is 0 whatever the input."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 3)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def test_a_source_whose_outputs_are_all_zero_is_said_so(cli, tmp_path, monkeypatch):
    """`cosine 1.000000` was printed for a ViT whose outputs were all zero: nothing was compared."""
    import sys

    import ptopt
    from ptopt.export.parity import all_zero_note

    res = ptopt.export(_ZeroHead().eval(), "torchscript", input_shapes=["1x4"], progress=False)
    assert "all zero" in all_zero_note(res.metrics["parity"])
    assert all_zero_note(_check(Scaled(0).eval(), Scaled(0).eval(), torch.randn(4, 16), "fp32")) is None
    monkeypatch.setattr(sys.modules[__name__], "zero_head", lambda: _ZeroHead(), raising=False)
    code, out, err = cli("export", f"{__name__}:zero_head", "--target", "torchscript", "--input-shape", "1x4",
                         "-o", tmp_path / "z.pt")  # fmt: skip
    assert code == 0, err
    assert "note:    the source's outputs are all zero on these inputs" in out


def test_token_data_is_padded_or_cut_to_each_checked_length():
    """Sentences of 13 tokens for a model taking 1..128: the check at max ran on random ids (the data did
    not fit 64x128) and rejected all-MiniLM-L6-v2's NNCF int8 (0.986); the sentences are padded to 128
    (mask 0) at max and cut to 1 token at min, so every shape is checked on real text."""
    from ptopt.core.data import Dataset
    from ptopt.export.parity import _real_inputs

    ids = torch.randint(5, 50, (4, 13), generator=torch.Generator().manual_seed(0))
    ds = Dataset({"input_ids": ids, "attention_mask": torch.ones(4, 13, dtype=torch.long)})
    specs = [
        InputSpec(n, (1, 1), (4, 13), (64, 128), "int64", (0, 50)) for n in ("input_ids", "attention_mask")
    ]
    top = _real_inputs(ds, specs, "max")
    assert top["input_ids"].shape == (64, 128) and torch.equal(top["input_ids"][:4, :13], ids)
    assert int(top["attention_mask"][:, 13:].sum()) == 0 and int(top["input_ids"][:, 13:].sum()) == 0
    low = _real_inputs(ds, specs, "min")
    assert low["input_ids"].shape == (1, 1) and int(low["input_ids"][0, 0]) == int(ids[0, 0])
    assert torch.equal(_real_inputs(ds, specs, "opt")["input_ids"], ids)
    images = Dataset(torch.randn(4, 3, 8, 8))  # no token data: only what fits
    assert (
        _real_inputs(images, [InputSpec("x", (1, 3, 8, 8), (4, 3, 8, 8), (64, 3, 16, 16), "float32")], "max")
        is None
    )
