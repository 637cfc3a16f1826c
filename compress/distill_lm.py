"""Token-level distillation of causal language models: the path ``ptopt.distill`` takes when the teacher
is a causal LM (a Hugging Face folder, ``hf:DIR``, or a transformers model in memory).

- **Models.** Teacher and student are Hugging Face folders (``core.hf``: safetensors, never a hub
  download) or transformers models in memory. A student folder holding only ``config.json`` starts
  from that config's fresh initialization (seeded). The student must share the teacher's vocabulary.
- **Data.** Text (``core.text``: a ``.txt`` file tokenized with the teacher folder's tokenizer, token
  ids in a ``.pt``/``.npy``, ``builtin:pydoc-text:calib|eval``), cut into windows of ``seq_len``
  tokens; the last window is padded and its padding masked (``attention_mask``).
- **Loss**, per scored token (a position whose next token is real text), averaged over the tokens of
  the global batch::

      loss = α·CE(student, next token) + (1−α)·T²·KL(softmax(teacher/T) ‖ softmax(student/T))

  ``α = 1`` is the language-model loss alone (the teacher is not run). Gradient accumulation, bf16
  autocast, checkpoints and DDP / FSDP come from the shared trainer.
- **Output**: a Hugging Face folder (``save_pretrained``: ``config.json``, ``model.safetensors``, the
  tokenizer) that ``AutoModelForCausalLM.from_pretrained`` loads, reloaded and compared before it
  counts; its sidecar beside it. With ``eval_data``, the held-out perplexity of student and teacher,
  scored as ``ptopt validate`` scores it (``core.lm.perplexity``: sliding window).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ptopt.compress.distill_config import DEFAULT_SEQ_LEN, LMOptions  # noqa: F401 - re-exported
from ptopt.core.errors import ShapeMismatchError, UsageError

#: the reloaded folder's logits may differ from the trained model's by this much (float noise)
RELOAD_ATOL = 1e-4


def is_lm_request(teacher: Any) -> bool:
    """Whether ``teacher`` is a causal language model (its distillation is token by token)."""
    from ptopt.core.hf import is_causal_lm, names_lm_folder
    from ptopt.core.modelref import LoadedModel

    if isinstance(teacher, (str, os.PathLike)):
        return names_lm_folder(teacher)
    module = teacher.module if isinstance(teacher, LoadedModel) else getattr(teacher, "model", teacher)
    return is_causal_lm(module)


class LMDistillLoss(nn.Module):
    """A trainer ``loss_fn`` for causal LMs (module docstring): ``loss(model, batch) -> (loss, None)``,
    a mean over the batch's scored tokens (``weight``)."""

    def __init__(self, teacher: Any, temperature: float, alpha: float):
        super().__init__()
        self._teacher = [teacher]  # hidden from parameters()/state_dict(): it never trains
        self.temperature, self.alpha = float(temperature), float(alpha)

    def frozen_modules(self) -> list[Any]:
        from ptopt.compress.distill_loss import frozen_teacher

        return frozen_teacher(self._teacher[0]) if self.alpha < 1 else []

    @staticmethod
    def scored(x: dict[str, Any]) -> Any:
        """Positions whose next token is real text (both attention-mask entries set)."""
        mask = x["attention_mask"].bool()
        return mask[:, :-1] & mask[:, 1:]

    def weight(self, batch: Any) -> int:
        return int(self.scored(batch.x).sum())

    def forward(self, model: Any, batch: Any) -> tuple[Any, Any]:
        x = batch.x
        keep, temp = self.scored(x), self.temperature
        inputs = dict(input_ids=x["input_ids"], attention_mask=x["attention_mask"], use_cache=False)
        if self.alpha < 1:  # the teacher first: only its scored log-probabilities outlive its forward
            with torch.no_grad():
                t_logits = self._teacher[0](**inputs).logits
                t_logp = F.log_softmax(t_logits[:, :-1][keep].float() / temp, -1)
                del t_logits
        logits = model(**inputs).logits
        s = logits[:, :-1][keep].float()
        del logits
        target = x["input_ids"][:, 1:][keep]
        t_logp = t_logp if self.alpha < 1 else None
        return _LMLoss.apply(s, target, t_logp, self.alpha, temp), None


class _LMLoss(torch.autograd.Function):
    """``α·CE(s, target) + (1−α)·T²·KL(p_t ‖ softmax(s/T))``, means over the rows of ``s`` (scored
    positions × vocabulary), with its gradient computed in the forward: d/ds = α·(softmax(s) − onehot)/n
    + (1−α)·T·(softmax(s/T) − p_t)/n. What the backward keeps is that one vocabulary-sized matrix, not
    the 4-6 that autograd's log-softmaxes, KL and cross-entropy save and allocate (per token, as many
    floats as the vocabulary: the largest activations of a small LM, alive when its output layer's
    backward holds the vocabulary matrix and its gradient, which is FSDP's peak)."""

    @staticmethod
    def forward(ctx: Any, s: Any, target: Any, t_logp: Any, alpha: float, temp: float) -> Any:
        n = max(s.shape[0], 1)
        with torch.autocast(s.device.type, enabled=False):
            loss, grad = s.new_zeros(()), None
            if alpha > 0:
                logp = torch.log_softmax(s, -1)
                loss = loss - alpha * logp.gather(1, target[:, None]).sum() / n
                grad = logp.exp_().mul_(alpha / n)  # softmax(s), weighed
                grad.scatter_add_(1, target[:, None], grad.new_full((s.shape[0], 1), -alpha / n))
            if t_logp is not None:
                logq = torch.log_softmax(s / temp, -1)
                p = t_logp.exp()
                kl = (torch.sub(t_logp, logq).mul_(p)).sum() / n
                loss = loss + (1 - alpha) * temp * temp * kl
                q_p = logq.exp_().sub_(p)  # softmax(s/T) - p_t
                grad = (
                    q_p.mul_((1 - alpha) * temp / n)
                    if grad is None
                    else grad.add_(q_p, alpha=(1 - alpha) * temp / n)
                )
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_out: Any) -> tuple[Any, ...]:
        (grad,) = ctx.saved_tensors
        return grad * grad_out, None, None, None, None


# -- data --------------------------------------------------------------------------------------------


def windows(ids: Any, seq_len: int, pad_id: int, name: str) -> Any:
    """``ids`` (1-D) cut into windows of ``seq_len`` tokens: a Dataset of ``input_ids`` and
    ``attention_mask``; the last window padded with ``pad_id`` (masked)."""
    from ptopt.core.data import Dataset
    from ptopt.core.errors import DataError

    if ids.numel() < 2:
        raise DataError(f"{name}: {ids.numel()} token(s); training needs at least 2")
    n = -(-ids.numel() // seq_len)
    flat = torch.full((n * seq_len,), pad_id, dtype=torch.long)
    mask = torch.zeros(n * seq_len, dtype=torch.long)
    flat[: ids.numel()], mask[: ids.numel()] = ids, 1
    if n > 1 and int(mask[(n - 1) * seq_len :].sum()) < 2:  # a last window of one token scores nothing
        n -= 1
        flat, mask = flat[: n * seq_len], mask[: n * seq_len]
    return Dataset({"input_ids": flat.view(n, seq_len), "attention_mask": mask.view(n, seq_len)}, None, name)


def _text_ids(ref: Any, vocab: int, tokenizer_dir: Any, what: str) -> Any:
    from ptopt.core.lm import token_ids

    return token_ids(ref, vocab, tokenizer_dir, what)


# -- models ------------------------------------------------------------------------------------------


def load_lm(ref: Any, allow_pickle: bool, role: str, seed: int) -> Any:
    """A LoadedModel holding a causal LM: a folder (``hf:DIR``; ``config.json`` alone: a fresh model of
    that config, seeded), a transformers model in memory, or a LoadedModel."""
    from ptopt.core.hf import WEIGHT_FILES, config_of, import_transformers, is_causal_lm, is_hf_dir
    from ptopt.core.modelref import HF_SCHEME, LoadedModel, as_loaded

    if isinstance(ref, (str, os.PathLike)):
        path = Path(str(ref)[len(HF_SCHEME) :] if str(ref).startswith(HF_SCHEME) else ref)
        if is_hf_dir(path) and not any((path / f).is_file() for f in WEIGHT_FILES):
            tf = import_transformers()
            torch.manual_seed(seed)
            module = tf.AutoModelForCausalLM.from_config(config_of(path), dtype=torch.float32)
            return LoadedModel(str(ref), "hf", module, path, None, info={"hf_dir": str(path), "fresh": True})
    loaded = as_loaded(ref, None, allow_pickle)
    if loaded.module is None or not is_causal_lm(loaded.module):
        raise UsageError(
            f"{role} {loaded.ref} is not a causal language model, and the teacher is one: give a Hugging "
            "Face folder (hf:DIR) of the same family"
        )
    return loaded


def load_lm_sharded(ref: Any, tcfg: Any, role: str) -> Any:
    """Under FSDP (several processes), a Hugging Face folder with safetensors weights loaded in shards:
    built with its parameters on the meta device, sharded (the trainer's wrap units and policies),
    then each process reads only its rows of every weight (``distributed.load_sharded``). None where
    that does not apply (one process, DDP, a fresh model of a config, a pickle, a model in memory):
    the caller loads it whole. The teacher too: it only runs forward, so its shards suffice."""
    from ptopt.compress import distributed as dist_util
    from ptopt.core.hf import config_of, import_transformers, is_causal_lm, is_hf_dir
    from ptopt.core.modelref import HF_SCHEME, LoadedModel
    from ptopt.core.quiet import quiet_imports

    if tcfg.strategy != "fsdp" or not dist_util.is_distributed() or not isinstance(ref, (str, os.PathLike)):
        return None
    path = Path(str(ref)[len(HF_SCHEME) :] if str(ref).startswith(HF_SCHEME) else ref)
    tensors = _safetensors_rows(path) if is_hf_dir(path) else None
    if tensors is None:
        return None
    tf, device = import_transformers(), dist_util.resolve_device(tcfg.device)
    with quiet_imports(), dist_util.parameters_on_meta():
        module = tf.AutoModelForCausalLM.from_config(config_of(path), dtype=torch.float32)
    if not is_causal_lm(module) or not tensors.covers(module):
        return None
    units = dist_util.shard_units(module, tcfg.shard_modules, strict=role == "student")
    policies = dist_util.fsdp_policies(
        tcfg.fsdp_param_dtype, tcfg.fsdp_reduce_dtype, tcfg.cpu_offload, device
    )
    dist_util.load_sharded(module.eval(), tensors, units, policies, device, frozen=role == "teacher")
    return LoadedModel(str(ref), "hf", module, path, None, info={"hf_dir": str(path), "sharded": True})


class _SafetensorsRows:
    """Rows of the tensors of a folder's safetensors files, read by slice (``safe_open``); a name
    the files lack but that is tied to one they hold (an LM head sharing the embedding) reads that."""

    def __init__(self, files: dict[str, Path]):
        from safetensors import safe_open

        self.files = {f: safe_open(str(f), "pt") for f in set(files.values())}
        self.where = {k: self.files[f] for k, f in files.items()}
        self.alias: dict[str, str] = {}

    def covers(self, module: Any) -> bool:
        """Whether every parameter of ``module`` is stored (itself or a parameter tied to it)."""
        groups: dict[int, list[str]] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            groups.setdefault(id(p), []).append(name)
        for names in groups.values():
            stored = [n for n in names if n in self.where]
            if not stored:
                return False
            self.alias.update({n: stored[0] for n in names})
        return True

    def __call__(self, name: str, rows: slice) -> Any:
        return self.where[self.alias.get(name, name)].get_slice(self.alias.get(name, name))[rows]


def _safetensors_rows(path: Path) -> Any:
    """A :class:`_SafetensorsRows` over ``path``'s ``model.safetensors`` (or the files its index
    names); None without safetensors weights."""
    import json

    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return _SafetensorsRows({k: path / f for k, f in weight_map.items()})
    single = path / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(single), "pt") as f:
        keys = list(f.keys())
    return _SafetensorsRows(dict.fromkeys(keys, single))


def check_pair(teacher: Any, student: Any) -> None:
    """The student must score the teacher's tokens: the same vocabulary (size) on both sides."""
    tv, sv = teacher.config.vocab_size, student.config.vocab_size
    if tv != sv:
        raise ShapeMismatchError(
            "the student's vocabulary differs from the teacher's: token-level distillation compares "
            "their next-token distributions over one vocabulary (use a student with the teacher's tokenizer)",
            expected=f"vocabulary {tv}",
            got=f"student vocabulary {sv}",
        )


def parameters_of(module: Any) -> int:
    """Parameters, each shared tensor once (tied embeddings); whole counts of sharded ones."""
    seen, total = set(), 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def weight_files(folder: Any) -> list[Path]:
    """The files a Hugging Face folder's weights are read from: ``model.safetensors``, or an index and
    every shard it names (the index alone names tensors, not their values), or ``pytorch_model.bin``."""
    import json

    from ptopt.core.hf import WEIGHT_FILES

    if not folder:
        return []
    folder, files = Path(folder), []
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        files.append(path)
        if name.endswith(".index.json"):
            try:
                shards = json.loads(path.read_text()).get("weight_map", {}).values()
            except (OSError, ValueError, AttributeError):
                shards = []
            files += [folder / s for s in sorted(set(shards)) if (folder / s).is_file()]
    return files


def teacher_digest(loaded: Any) -> str:
    """What identifies the teacher's weights in a checkpoint's fingerprint: the sha256 of its weight
    files (``weight_files``), else of its tensors."""
    from ptopt.compress.checkpoint import tensor_digest
    from ptopt.core.artifact import sha256_file

    files = weight_files(loaded.info.get("hf_dir"))
    if files:
        return "+".join(sha256_file(f)[:16] for f in files)
    return tensor_digest(loaded.module.state_dict().values())


# -- the flow ----------------------------------------------------------------------------------------


def distill_lm(
    teacher: Any,
    student: Any,
    train_data: Any,
    output: Any,
    dcfg: Any,
    tcfg: Any,
    run: Any,
    lm: LMOptions,
    *,
    eval_data: Any = None,
    allow_pickle: bool = False,
    epoch_hooks: Any = (),
    progress: bool = True,
) -> Any:
    """``ptopt.distill`` of a causal LM (module docstring); ``dcfg``/``tcfg``/``run``/``lm`` resolved by
    ``distill`` (``lm.qat``: quantization-aware training of the student, ``ptopt.compress.lm_qat``).
    Rank 0 returns the Result, other ranks None."""
    from ptopt.compress import distributed as dist_util
    from ptopt.compress import lm_qat
    from ptopt.compress.stage import finish
    from ptopt.core.result import check_folder_output

    seq_len, qat = lm.seq_len or DEFAULT_SEQ_LEN, lm.qat
    if output is not None:
        check_folder_output(Path(output), "hf_weight_only" if qat else "hf")
    t_loaded = load_lm_sharded(teacher, tcfg, "teacher") or load_lm(
        teacher, allow_pickle, "teacher", tcfg.seed
    )
    s_loaded = (not qat and load_lm_sharded(student, tcfg, "student")) or load_lm(
        student, allow_pickle, "student", tcfg.seed
    )
    check_pair(t_loaded.module, s_loaded.module)
    if qat:
        lm_qat.prepare(s_loaded.module, qat)
    tok_dir = t_loaded.info.get("hf_dir") or s_loaded.info.get("hf_dir")
    vocab = t_loaded.module.config.vocab_size
    train_ids = _text_ids(train_data, vocab, tok_dir, "training text")
    eval_ids = _text_ids(eval_data, vocab, tok_dir, "evaluation text") if eval_data is not None else None
    pad = _pad_id(t_loaded.module)
    data = windows(train_ids, seq_len, pad, _name(train_data, "training text"))
    loss = LMDistillLoss(t_loaded.module.eval(), dcfg.temperature, dcfg.alpha)
    # output_loss: the classifier's (refused here); checkpoints written before it have no such field
    same = {k: v for k, v in dcfg.to_dict().items() if k != "output_loss"}
    fingerprint = {**same, "seq_len": seq_len, "qat": qat, "teacher": teacher_digest(t_loaded)}
    hooks = dict(epoch_hooks=epoch_hooks, progress=progress)
    result = _train(s_loaded.module, data, tcfg, loss, fingerprint, run, hooks)
    if qat and dist_util.is_main_process():
        lm_qat.convert(result.model, qat)
    from_files = isinstance(teacher, (str, os.PathLike))  # else a model in memory: its tensors count
    measured = _perplexities(t_loaded, result, eval_ids, (eval_data, from_files), qat)  # collective (FSDP)
    if not dist_util.is_main_process():
        return None
    facts = {"seq_len": seq_len, "train_tokens": int(train_ids.numel()), "windows": len(data), "pad_id": pad}
    built = _result(t_loaded, s_loaded, result, dcfg, tcfg, measured, facts, (train_data, eval_data), qat)
    return finish(built, output)


def _train(student: Any, data: Any, tcfg: Any, loss: Any, fingerprint: dict, run: Any, hooks: dict) -> Any:
    from ptopt.compress.trainer import train

    student.train()
    label = hooks["progress"] and ("distill" if loss.alpha < 1 else "train (LM loss)")
    return train(
        student, data, tcfg, loss_fn=loss, fingerprint_extra=fingerprint, progress=label,
        epoch_hooks=hooks["epoch_hooks"], checkpoint_dir=run.checkpoint_dir, resume=run.resume,
        log_dir=run.log_dir, metrics_file=run.metrics_file,
    )  # fmt: skip


def _pad_id(model: Any) -> int:
    config = model.config
    for key in ("pad_token_id", "eos_token_id"):
        value = getattr(config, key, None)
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(value, int) and 0 <= value < config.vocab_size:
            return value
    return 0


def _name(ref: Any, what: str) -> str:
    return str(ref) if isinstance(ref, (str, os.PathLike)) else f"in-memory {what}"


def _perplexities(t_loaded: Any, result: Any, ids: Any, source: tuple, qat: str | None) -> dict[str, Any]:
    """Held-out perplexity of student and teacher (``core.lm.perplexity``, at most EVAL_TOKENS tokens;
    the teacher's read from ptopt's cache when its weights and the text were scored before:
    :func:`teacher_perplexity`); every rank scores the same windows (a sharded model's forward is
    collective). A QAT student is scored quantized, on rank 0 (rank 0 alone holds it converted).
    ``source``: the evaluation text's reference and whether the teacher was loaded from files."""
    from ptopt.compress import distributed as dist_util
    from ptopt.core.lm import eval_window, perplexity

    if ids is None:
        return {}
    ref, from_files = source
    ids, of = eval_window(ids)
    base = teacher_perplexity(t_loaded, ids, _name(ref, "evaluation text"), from_files)
    if qat:
        if not dist_util.is_main_process():
            return {}
        student = result.model
    else:
        student = result.sharded if result.sharded is not None else result.model
    mine = perplexity(student.eval(), ids, what="student perplexity")
    return {
        "eval_data": _name(ref, "evaluation text"),
        "perplexity_window": {"context": mine["context"], "stride": mine["stride"], "tokens": mine["tokens"]}
        | ({"of_tokens": of} if of else {}),
        "perplexity": mine["perplexity"],
        "teacher_perplexity": base["perplexity"],
    } | ({"teacher_perplexity_cached": True} if base.get("cached") else {})


#: the cache's name for a teacher's held-out perplexity (``core.figure_cache``)
TEACHER_PPL = "teacher-perplexity"


def teacher_perplexity(t_loaded: Any, ids: Any, eval_name: str, from_files: bool) -> dict[str, Any]:
    """``core.lm.perplexity`` of the teacher on ``ids``, or the figure a run with the same weights, text
    and settings stored (``core.figure_cache``; :func:`perplexity_facts`), said in a progress line and
    marked ``cached``. Every rank takes rank 0's answer: a sharded teacher's forward is collective."""
    from ptopt.compress import distributed as dist_util
    from ptopt.core import progress
    from ptopt.core.figure_cache import read_figure, store_figure
    from ptopt.core.lm import perplexity

    facts = perplexity_facts(t_loaded, ids, eval_name, from_files) if dist_util.is_main_process() else None
    hit = dist_util.broadcast_object(read_figure(TEACHER_PPL, facts) if facts else None)
    if hit and isinstance(hit.get("perplexity"), (int, float)):
        progress.note(f"teacher perplexity {hit['perplexity']:.3f} (cached, same weights and data)")
        return {**hit, "cached": True}
    base = perplexity(t_loaded.module.eval(), ids, what="teacher perplexity")
    if facts:
        store_figure(TEACHER_PPL, facts, base)
    return base


def scoring_digest() -> str:
    """The sha256 (16 hex) of the perplexity code's source (``core/lm.py``), or ``"unknown"``."""
    import hashlib

    from ptopt.core import lm

    try:
        return hashlib.sha256(Path(lm.__file__).read_bytes()).hexdigest()[:16]
    except (OSError, TypeError):
        return "unknown"


def perplexity_facts(t_loaded: Any, ids: Any, eval_name: str, from_files: bool) -> dict[str, Any] | None:
    """What the teacher's perplexity on ``ids`` depends on: its weights (the sha256 of its weight files
    when it was loaded from them here, else of its tensors' bytes), its config, parameter dtypes and
    device, the text (reference and the digest of the token ids scored), the window, the scoring code
    (the sha256 of ``core/lm.py``'s source: a development tree whose scoring changed under the same
    version reads no stale figure) and the versions of ptopt, torch and transformers. None when its
    tensors cannot be digested (nothing is cached)."""
    import ptopt
    from ptopt.compress.checkpoint import tensor_digest
    from ptopt.core.hf import import_transformers
    from ptopt.core.lm import CONTEXT, STRIDE

    module = t_loaded.module
    try:
        if from_files and weight_files(t_loaded.info.get("hf_dir")):
            weights = "files " + teacher_digest(t_loaded)
        else:
            weights = "tensors " + tensor_digest(module.state_dict().values())
    except (TypeError, RuntimeError, AttributeError, ValueError):  # a tensor subclass with no plain bytes
        return None
    config = module.config.to_dict()
    params = list(module.parameters())
    return {
        "weights": weights,
        "config": {k: v for k, v in config.items() if k not in ("_name_or_path", "transformers_version")},
        "dtypes": sorted({str(p.dtype) for p in params}),
        "device": params[0].device.type if params else "cpu",
        "eval_data": eval_name,
        "eval_ids": f"{tensor_digest([ids])} ({int(ids.numel())} tokens)",
        "window": {"context": CONTEXT, "stride": STRIDE},
        "scoring": scoring_digest(),
        "versions": {"ptopt": ptopt.__version__, "torch": torch.__version__,
                     "transformers": import_transformers().__version__},
    }  # fmt: skip


def _result(
    t_loaded: Any,
    s_loaded: Any,
    result: Any,
    dcfg: Any,
    tcfg: Any,
    measured: dict,
    facts: dict,
    refs: tuple,
    qat: str | None = None,
) -> Any:
    """The trained student (rank 0's) as an unsaved Result whose writer writes a Hugging Face folder
    (with ``qat``: ptopt's quantized folder, ``hf_weight_only``)."""
    from ptopt.compress import lm_qat
    from ptopt.compress.stage import UNSAVED, input_files
    from ptopt.core.artifact import Artifact
    from ptopt.core.result import Result

    module = result.model.eval()
    t_params, s_params = parameters_of(t_loaded.module), parameters_of(module)
    measured = dict(measured)
    cached = {"teacher_perplexity_cached": True} if measured.pop("teacher_perplexity_cached", False) else {}
    names = {k: _name(v, k) for k, v in zip(("train_data", "eval_data"), refs, strict=True) if v is not None}
    template = Artifact(
        path=UNSAVED,
        format="hf_weight_only" if qat else "hf",
        config={**dcfg.to_dict(), "train": tcfg.to_dict(), "teacher": str(t_loaded.ref), "qat": qat,
                "student": str(s_loaded.ref), "task": "causal-lm", **names, **facts},
        parent=t_loaded.parent_record(),
        precision=lm_qat.precision(qat) if qat else "fp32",
        metrics={"student_parameters": s_params, "teacher_parameters": t_params, **measured},
        extra={"teacher": t_loaded.parent_record(), "student": s_loaded.parent_record(),
               **result.summary(), "parameter_ratio": s_params / max(t_params, 1), **cached,
               "loaded_in_shards": [r for r, m in (("teacher", t_loaded), ("student", s_loaded))
                                    if m.info.get("sharded")]},
    )  # fmt: skip
    tok_dir = s_loaded.info.get("hf_dir") if _has_tokenizer(s_loaded) else t_loaded.info.get("hf_dir")
    sources = input_files(t_loaded.path, s_loaded.path, *refs)  # their folders too: never written over
    if qat:
        write = lambda p: lm_qat.write_folder(module, p, tok_dir, qat)  # noqa: E731
    else:
        write = lambda p: write_folder(module, p, tok_dir)  # noqa: E731
    return Result(module, template, write, inputs_paths=sources, folder=True)


def _has_tokenizer(loaded: Any) -> bool:
    from ptopt.core.hf import has_tokenizer

    folder = loaded.info.get("hf_dir")
    return bool(folder) and has_tokenizer(folder)


def write_folder(module: Any, path: Path, tokenizer_dir: Any) -> dict[str, Any]:
    """``module.save_pretrained(path)`` (safetensors) plus the tokenizer files of ``tokenizer_dir``;
    the folder is loaded back with ``core.hf.load_causal_lm`` and its logits compared first."""
    from ptopt.core.hf import load_causal_lm
    from ptopt.core.quiet import quiet_imports
    from ptopt.formats.hf import copy_companions

    with quiet_imports():
        module.save_pretrained(str(path), safe_serialization=True)
    files = copy_companions(tokenizer_dir, path)
    ids = torch.arange(min(16, module.config.vocab_size)).unsqueeze(0)
    reloaded = load_causal_lm(path)
    with torch.inference_mode():
        want = module(input_ids=ids, use_cache=False).logits
        got = reloaded(input_ids=ids, use_cache=False).logits
    diff = float((want - got).abs().max())
    if diff > RELOAD_ATOL:
        raise RuntimeError(
            f"{path}: the saved folder computes other logits than the trained model (max diff {diff})"
        )
    return {"files": files, "extra": {"reload_max_abs_diff": diff}}
