"""A language-model folder ptopt writes keeps its source's whole tokenizer: transformers 5 saves the chat
template as ``chat_template.jinja`` (named ones under ``additional_chat_templates/``), which the copy
left out, so ``apply_chat_template`` on the quantized or exported folder failed (SmolLM2's folder has
one). Tiny random-weight Llama with a word tokenizer (``tests.export.lm_models``)."""

from __future__ import annotations

import pytest

import ptopt
from ptopt.core.hf import import_transformers
from tests.export.lm_models import save

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    folder = save("llama", tmp_path_factory.mktemp("chat") / "llama")
    tok = import_transformers().AutoTokenizer.from_pretrained(folder)
    tok.chat_template = {"default": TEMPLATE, "tool_use": TEMPLATE + "!"}
    tok.save_pretrained(folder)
    assert (folder / "chat_template.jinja").is_file()
    assert (folder / "additional_chat_templates" / "tool_use.jinja").is_file()
    return folder


def _chat(folder) -> str:
    tok = import_transformers().AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "w7 w8"}]
    assert tok.apply_chat_template(messages, tokenize=False, chat_template="tool_use").endswith("!")
    return tok.apply_chat_template(messages, tokenize=False)


def test_cli_weight_only_folder_keeps_the_chat_template(cli, src, tmp_path):
    code, _, err = cli("quantize", f"hf:{src}", "--mode", "weight-only", "-o", tmp_path / "int8")
    assert code == 0, err
    assert _chat(tmp_path / "int8") == _chat(src) == "<user>w7 w8"


def test_api_exported_folder_keeps_the_chat_template(src, tmp_path):
    ptopt.export(f"hf:{src}", "exported_program", tmp_path / "ep", new_tokens=2, progress=False)
    assert _chat(tmp_path / "ep") == _chat(src)
