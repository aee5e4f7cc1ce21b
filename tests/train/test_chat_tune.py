"""The chat tuning's data: instruction pairs from Python source, and labels only on the answer."""

from __future__ import annotations

from solo.train.chat_tune import CHAT_TEMPLATE, Pair, pairs_from_source, render

SOURCE = '''
import functools

def add(a, b=1):
    """Return the sum of a and b.

    More text that is not part of the summary.
    """
    return a + b

class Box:
    @functools.cache
    def size(self, unit="cm"):
        """The size of the box in the given unit."""
        return 3

    def undocumented(self):
        return 0

def _short():
    """Too short."""
'''


def test_pairs_from_functions_and_methods_with_docstrings():
    pairs = pairs_from_source(SOURCE)
    assert [p.request for p in pairs] == [
        "Write a Python function `add(a, b=1)`: Return the sum of a and b.",
        "Write a Python function `size(self, unit='cm')`: The size of the box in the given unit.",
    ]
    assert pairs[0].answer.startswith("```python\ndef add(a, b=1):") and pairs[0].answer.endswith("return a + b\n```")
    assert pairs[1].answer.startswith("```python\n@functools.cache\ndef size(self")  # decorators kept, dedented
    assert pairs_from_source("def broken(:") == []


def test_render_masks_all_but_the_answer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[u]": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz\n` ")}},
                                     unk_token="[u]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    ids, labels = render(tok, Pair("hi", "ok"), bos=100, start=101, end=102)
    assert ids[:2] == [100, 101] and len(ids) == len(labels)
    answer = [i for i, label in zip(ids, labels, strict=True) if label != -100]
    assert answer == [tok.token_to_id("o"), tok.token_to_id("k"), 102]


def test_template_renders_chatml_with_tools():
    from solo.chat_template import ChatTemplate

    template = ChatTemplate(CHAT_TEMPLATE, {"bos_token": "<|bos|>", "eos_token": "<|eos|>"})
    text = template.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                           add_generation_prompt=True)
    assert text == "<|bos|><|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    text = template.render([{"role": "user", "content": "U"}], add_generation_prompt=True, tools=[tool])
    assert "<tools>" in text and "get_weather" in text and text.endswith("<|im_start|>assistant\n")


def test_bundled_template_matches_the_training_format():
    import json

    import pytest
    from tokenizers import Tokenizer

    from solo import Engine
    from solo.model.default_model import default_model_path

    folder = default_model_path()
    if "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text()):
        pytest.skip("the bundled model has no chat template")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos, start, end = (tok.token_to_id(t) for t in ("<|bos|>", "<|im_start|>", "<|im_end|>"))
    pair = Pair("Write a Python function `add(a, b)`: Return the sum.", "def add(a, b):\n    return a + b")
    ids, labels = render(tok, pair, bos, start, end)
    prompt = ids[:next(i for i, label in enumerate(labels) if label != -100)]
    engine = Engine.load(None, backend="eager")
    assert engine.encode_prompt([{"role": "user", "content": pair.request}]) == prompt
    assert end in engine.eos_ids  # a reply ends at <|im_end|>
    assert engine.config.context_length >= 2048
    card = (folder / "README.md").read_text()
    tuning = json.loads((folder / "chat_tuning.json").read_text())
    assert tuning["heldout_answer_loss_after"] < tuning["heldout_answer_loss_before"]
    assert f"{tuning['heldout_answer_loss_after']:.4f}" in card


def test_out_is_checked_first_and_the_tuned_model_lands_there(tmp_path, monkeypatch, capsys):
    # A new user's finds: `--out chat-model` left only chat-model.tmp, and `--out .` trained for the whole budget,
    # then failed with a traceback and lost the model.
    import pytest

    from solo.train.chat_tune import TUNING_NAME, main
    from solo.train.pipeline import replace_model_folder

    monkeypatch.chdir(tmp_path)
    for out, words in ((".", "the working folder"), (str(tmp_path.parent), "one above it")):
        with pytest.raises(SystemExit) as info:
            main(["--out", out])
        assert info.value.code == 2 and words in capsys.readouterr().err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(SystemExit):
        main(["--out", "notes"])
    assert "not a model this recipe wrote (chat_tuning.json missing)" in capsys.readouterr().err
    # The finished folder replaces an earlier tuned model at --out.
    for run in ("first", "second"):
        tmp = tmp_path / "chat-model.tmp"
        tmp.mkdir()
        (tmp / TUNING_NAME).write_text(run)
        replace_model_folder(tmp, tmp_path / "chat-model", None, TUNING_NAME)
        assert (tmp_path / "chat-model" / TUNING_NAME).read_text() == run and not tmp.exists()
