import lzma
import math

import pytest
import torch

from solo.train.evaluate import evaluate_documents, scoring_windows, xz_bits_per_byte


@pytest.mark.parametrize("n_tokens", [2, 3, 7, 8, 9, 16, 17, 40, 101])
@pytest.mark.parametrize(("context", "stride"), [(8, 4), (8, 6), (8, 7), (8, 1), (2, 1)])
def test_windows_score_every_target_once(n_tokens: int, context: int, stride: int) -> None:
    scored: list[int] = []
    for start, end, first in scoring_windows(n_tokens, context, stride):
        assert 0 <= start < first <= end <= n_tokens and end - start <= context
        scored.extend(range(first, end))
        if start > 0:  # past the first window every target has >= context - stride tokens before it
            assert first - start >= context - stride
    assert scored == list(range(1, n_tokens))


def test_window_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        list(scoring_windows(20, 8, 8))
    with pytest.raises(ValueError):
        list(scoring_windows(1, 8, 4))


class UniformLM(torch.nn.Module):
    """Predicts the uniform distribution over `vocab` tokens: NLL is exactly ln(vocab)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False):  # noqa: ARG002
        logits = torch.zeros(*input_ids.shape, self.vocab)

        class Out:
            pass

        out = Out()
        out.logits = logits
        return out


def test_uniform_model_bits_per_byte() -> None:
    docs = [[0, 5, 6, 7, 1], [0, *range(3, 40), 1], [0, 1]]
    n_bytes = 100
    r = evaluate_documents(UniformLM(64), docs, n_bytes, context=8, stride=5, batch_size=3)
    n_scored = sum(len(d) - 1 for d in docs)  # every token but BOS, EOS included
    assert r.n_tokens == n_scored and r.n_files == 3
    assert r.loss == pytest.approx(math.log(64))
    assert r.bits_per_byte == pytest.approx(n_scored * 6 / n_bytes)


def test_xz_baseline_matches_lzma() -> None:
    texts = ["def f(x):\n    return x\n" * 50, "import os\nprint(os.getcwd())\n" * 20]
    r = xz_bits_per_byte(texts)
    n = sum(len(t.encode()) for t in texts)
    joined = lzma.compress("".join(texts).encode(), preset=9 | lzma.PRESET_EXTREME)
    assert r["n_bytes"] == n
    assert r["concatenated_bits_per_byte"] == pytest.approx(8 * len(joined) / n)
    assert r["per_file_compressed_bytes"] > r["concatenated_compressed_bytes"]
    with pytest.raises(ValueError):
        xz_bits_per_byte([""])
