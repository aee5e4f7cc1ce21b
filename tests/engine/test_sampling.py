"""Sampling: transformers' processors (repetition penalty, temperature, top-k/p, min-p), OpenAI penalties,
seeds, and validation messages."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from solo import Engine, SamplingParams
from solo.engine.sampling import TokenSampler
from solo.errors import InvalidRequestError, SoloError
from solo.model.generation_config import GenerationDefaults

VOCAB = 50


def _sampler(prompt_ids=(), **kwargs):
    params = SamplingParams(seed=0, **kwargs).resolve(GenerationDefaults(), fallback_temperature=1.0)
    return TokenSampler(params, list(prompt_ids), VOCAB)


@pytest.fixture()
def logits():
    torch.manual_seed(0)
    return torch.randn(VOCAB) * 3


def test_repetition_penalty_matches_transformers(logits):
    prompt, generated = [1, 5, 7], [9, 5]
    sampler = _sampler(prompt, repetition_penalty=1.3, temperature=0)
    for t in generated:
        sampler.observe(t)
    expected = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + generated]), logits[None].clone())[0]
    assert torch.allclose(sampler.process(logits), expected)


def test_presence_and_frequency_penalties_follow_openai(logits):
    sampler = _sampler([3, 3, 3], presence_penalty=0.5, frequency_penalty=0.25, temperature=0)
    for t in [4, 4, 6]:
        sampler.observe(t)
    out = sampler.process(logits)
    expected = logits.clone()
    expected[4] -= 0.5 + 2 * 0.25
    expected[6] -= 0.5 + 0.25
    assert torch.allclose(out, expected)  # prompt tokens (3) are not penalised


@pytest.mark.parametrize(
    "kwargs, warpers",
    [
        ({"temperature": 0.7}, [TemperatureLogitsWarper(0.7)]),
        ({"temperature": 1.0, "top_k": 5}, [TopKLogitsWarper(5)]),
        ({"temperature": 1.0, "top_p": 0.8}, [TopPLogitsWarper(0.8)]),
        ({"temperature": 1.0, "min_p": 0.1}, [MinPLogitsWarper(0.1)]),
        ({"temperature": 0.5, "top_k": 10, "top_p": 0.9, "min_p": 0.05},
         [TemperatureLogitsWarper(0.5), TopKLogitsWarper(10), TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)]),
    ],
)
def test_warpers_match_transformers(logits, kwargs, warpers):
    expected = logits[None].clone()
    for warper in warpers:
        expected = warper(None, expected)
    out = _sampler(**kwargs).process(logits)
    assert torch.equal(torch.isinf(out), torch.isinf(expected[0]))
    finite = ~torch.isinf(out)
    assert torch.allclose(out[finite], expected[0][finite])


def test_seed_reproducibility(tiny_llama):
    engine = Engine.load(tiny_llama)
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=1234, ignore_eos=True)
    first = engine.complete("def f(x):", params).token_ids
    assert engine.complete("def f(x):", params).token_ids == first
    others = {tuple(engine.complete("def f(x):", params.copy(seed=s)).token_ids) for s in (1, 2, 3)}
    assert tuple(first) not in others or len(others) > 1


def test_tuples_are_taken_as_lists():
    params = SamplingParams(stop=("a", "b"), stop_token_ids=(3,), bad_words=("x",), allowed_token_ids=(1, 2))
    assert (params.stop, params.stop_token_ids, params.bad_words, params.allowed_token_ids) == (
        ["a", "b"], [3], ["x"], [1, 2])



def test_none_means_the_default_for_every_field():
    # vLLM's SamplingParams takes stop=None and the like; the server's null means the default too.
    every = {f: None for f in SamplingParams.field_names()}
    assert SamplingParams(**every) == SamplingParams()
    assert SamplingParams(stop=None, bad_words=None, presence_penalty=None, min_tokens=None).stop == []

def test_seeds_beyond_32_bits_draw_differently_on_the_cpu():
    # The CPU generator keeps a seed's low 32 bits: seeds 2**32 apart drew the same tokens.
    from solo.engine.sampling import generator_seed

    cpu = torch.device("cpu")
    seeds = (7, 7 + 2**32, 7 + 5 * 2**40, -7, 2**32 - 7, 2**63 - 1, -(2**63))
    mixed = [generator_seed(s, cpu) for s in seeds]
    assert mixed[0] == 7 and mixed[4] == 2**32 - 7  # seeds within 32 bits are kept (their draws do not change)
    assert len(set(mixed)) == len(seeds) and all(0 <= m < 2**32 for m in mixed)
    assert generator_seed(7 + 2**32, torch.device("cuda")) == 7 + 2**32  # Philox takes all 64 bits
    draws = {tuple(torch.rand(4, generator=torch.Generator().manual_seed(m)).tolist()) for m in mixed}
    assert len(draws) == len(seeds)


def test_penalties_change_generation(tiny_llama):
    engine = Engine.load(tiny_llama)
    base = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    plain = engine.complete("def f(x):", base).token_ids
    for change in ({"repetition_penalty": 1.5}, {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        penalised = engine.complete("def f(x):", base.copy(**change)).token_ids
        assert penalised != plain, change
        if "repetition_penalty" not in change:
            # A strong presence/frequency penalty makes repeats rarer than in the plain greedy run.
            assert len(set(penalised)) >= len(set(plain))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
        ({"top_k": -2}, "top_k must be an integer >= -1 (0 or -1 disables it)"),
        ({"min_p": 2.0}, "min_p must be in [0, 1]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"presence_penalty": 3.0}, "presence_penalty must be in [-2, 2]"),
        ({"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2]"),
        ({"repeat_last_n": -2}, "repeat_last_n must be an integer >= -1 (-1: the whole sequence, 0: no penalties)"),
        ({"repeat_last_n": 1.5}, "repeat_last_n must be an integer >= -1"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"stop": [""]}, "stop holds an empty string"),
    ],
)
def test_invalid_sampling_values(kwargs, message):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert message in str(err.value)
    assert err.value.param == next(iter(kwargs))


def test_defaults_come_from_generation_config_then_fallback():
    defaults = GenerationDefaults(do_sample=True, temperature=0.6, top_p=0.9)
    resolved = SamplingParams().resolve(defaults)
    assert (resolved.temperature, resolved.top_p, resolved.top_k) == (0.6, 0.9, 0)
    assert SamplingParams(temperature=0.2).resolve(defaults).temperature == 0.2
    assert SamplingParams().resolve(GenerationDefaults(), fallback_temperature=1.0).temperature == 1.0
    assert SamplingParams().resolve(GenerationDefaults()).greedy



@pytest.mark.parametrize("filters", [{"top_p": 0.9}, {"top_k": 40}, {"min_p": 0.05}])
def test_a_sampling_filter_without_a_temperature_samples_where_the_defaults_are_greedy(filters):
    """top_k / top_p / min_p act only when sampling: greedy decoding would silently ignore them."""
    greedy_by_config = GenerationDefaults(do_sample=False)
    assert SamplingParams(**filters).resolve(greedy_by_config).temperature == 1.0
    assert SamplingParams(**filters).resolve(GenerationDefaults()).temperature == 1.0  # the greedy fallback
    # the config's own temperature where it gives one; an explicit temperature always stands
    assert SamplingParams(**filters).resolve(GenerationDefaults(do_sample=False, temperature=0.7)).temperature == 0.7
    assert SamplingParams(temperature=0, **filters).resolve(greedy_by_config).greedy
    # filters that do nothing, or none: the defaults' greedy decoding stays
    for inert in ({"top_p": 1.0}, {"top_k": 0}, {"top_k": -1}, {"min_p": 0.0}, {"seed": 3}, {}):
        assert SamplingParams(**inert).resolve(greedy_by_config).greedy, inert

def test_params_may_be_a_dict(tiny_llama):
    engine = Engine.load(tiny_llama)
    as_dict = engine.complete("def f(x):", {"max_tokens": 6, "ignore_eos": True})
    assert as_dict.token_ids == engine.complete("def f(x):", SamplingParams(max_tokens=6, ignore_eos=True)).token_ids
    with pytest.raises(InvalidRequestError, match="unknown sampling parameter\\(s\\) 'max_new_tokens'"):
        engine.complete("x", {"max_new_tokens": 3})
    with pytest.raises(InvalidRequestError, match="params must be a SamplingParams or a dict"):
        engine.complete("x", 3)


def test_an_open_stream_in_the_same_thread_is_an_error_not_a_deadlock(tiny_llama):
    engine = Engine.load(tiny_llama)
    stream = engine.generate("def f(x):", {"max_tokens": 8, "ignore_eos": True})
    next(stream)
    with pytest.raises(SoloError, match="still open in this thread.*close\\(\\) it"):
        engine.complete("x", {"max_tokens": 2})
    stream.close()
    assert len(engine.complete("x", {"max_tokens": 2, "ignore_eos": True}).token_ids) == 2


def test_a_stream_read_by_another_thread_no_longer_holds_the_thread_that_started_it(tiny_llama):
    # A thread pool hands a server's streams between its threads: the thread that started a stream another
    # thread now reads may start the next one, which waits for it (it was refused at once: "still open in
    # this thread").
    import threading
    import time

    engine = Engine.load(tiny_llama)
    alone = engine.complete("x", {"max_tokens": 3, "ignore_eos": True}).token_ids
    stream = engine.generate("def f(x):", {"max_tokens": 8, "ignore_eos": True})
    next(stream)

    def read_slowly() -> None:
        for _ in stream:
            time.sleep(0.05)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    assert engine.complete("x", {"max_tokens": 3, "ignore_eos": True}).token_ids == alone  # (waited for it)
    reader.join()
    assert not reader.is_alive()


def test_a_tuple_of_messages_is_chat_everywhere(tiny_llama):
    # (a tuple reached the template but was not chat for continue_final_message, tools or template kwargs)
    engine = Engine.load(tiny_llama)
    messages = ({"role": "user", "content": "x"}, {"role": "assistant", "content": "def"})
    assert engine.complete(messages, {"max_tokens": 2}, continue_final_message=True).token_ids == \
        engine.complete(list(messages), {"max_tokens": 2}, continue_final_message=True).token_ids

@pytest.mark.parametrize("prompt, message", [
    ("a\ud800b", "not valid Unicode text"),
    (b"abc", "got bytes"),
    ([], "got an empty list"),
    (None, "got NoneType"),
    (5, "got int"),
    (3.5, "got float"),
    ({"role": "user", "content": "x"}, "got dict"),
    ([True], "got a list of bool"),
    (["x"], "got a list of str; for several prompts, call complete\\(\\) or generate\\(\\) once per prompt"),
    ([[1, 2], [3]], "got a list of list; for several prompts"),
    ([{"role": "user", "content": "x"}, "y"], "got a list of dict$"),  # not a batch: no batch hint
])
def test_prompts_of_the_wrong_kind_are_clear_errors(tiny_llama, prompt, message):
    with pytest.raises(InvalidRequestError, match=message):
        Engine.load(tiny_llama).complete(prompt, {"max_tokens": 2})


@pytest.mark.parametrize("kwargs, message", [
    ({"seed": 2**64}, "seed must be an integer in \\[-2\\*\\*63, 2\\*\\*63\\)"),
    ({"stop": ["\udcff"]}, "stop must be valid Unicode text"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids must be a list of token ids"),
    ({"stop_token_ids": [10**6]}, "stop_token_ids holds 1000000, outside the vocabulary"),
])
def test_seed_and_stop_values_are_checked(tiny_llama, kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        Engine.load(tiny_llama).complete("x", {"max_tokens": 2, **kwargs})


def test_revision_is_refused_for_a_local_folder(tiny_llama):
    from solo.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="applies to Hub ids only"):
        Engine.load(tiny_llama, revision="main")
    with pytest.raises(ModelNotFoundError, match="folder path or a Hugging Face Hub id string, got int"):
        Engine.load(123)


def test_stop_token_ids_hold_with_ignore_eos_and_special_token_stop_strings_match(tiny_llama):
    engine = Engine.load(tiny_llama)
    free = engine.complete("def f(x):", {"max_tokens": 12, "ignore_eos": True})
    target = free.token_ids[3]
    stopped = engine.complete("def f(x):", {"max_tokens": 12, "ignore_eos": True, "stop_token_ids": [target]})
    assert stopped.token_ids == free.token_ids[:free.token_ids.index(target) + 1]
    assert stopped.finish_reason == "stop"
    events = list(engine.generate("def f(x):", {"max_tokens": 12, "ignore_eos": True, "stop_token_ids": [target]}))
    assert events[-1].stop_reason == target  # vLLM's stop_reason: the stop token's id
    assert stopped.stop_reason == target
    # "<|im_end|>" is a special token of the test tokenizer: decoded text never shows it, so it stops by id.
    special = engine.tokenizer.special_token_ids()["<|im_end|>"]
    request = engine.make_request("def f(x):", {"max_tokens": 4, "stop": ["<|im_end|>"]})
    assert special in request.eos_ids


def test_draw_categorical_follows_the_distribution_and_never_draws_a_zero():
    from solo.engine.sampling import draw_categorical

    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([draw_categorical(probs, generator) for _ in range(20000)]), minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.allclose(counts / 20000, probs, atol=0.015)  # ~4.5 standard deviations at p = 0.5
    assert draw_categorical(torch.tensor([0.0, 0.0, 3.0]), generator) == 2  # unnormalised weights


def test_repetition_penalty_touches_exactly_the_seen_tokens(logits):
    # The penalty over the seen ids only gives the bits of the whole-vocabulary formula.
    sampler = _sampler([1, 5, 7, 5], repetition_penalty=1.3, temperature=0)
    for t in [9, 5, 49]:
        sampler.observe(t)
    seen = torch.zeros(VOCAB, dtype=torch.bool)
    seen[[1, 5, 7, 9, 49]] = True
    expected = torch.where(seen, torch.where(logits < 0, logits * 1.3, logits / 1.3), logits)
    assert torch.equal(sampler.process(logits), expected)


@pytest.mark.parametrize("n", [1, 3, 6, 50])
def test_repeat_last_n_penalizes_the_last_n_tokens_only(logits, n):
    # llama.cpp's window: after each token, the repetition penalty is transformers' over the sequence's last n
    # tokens (prompt and output), presence / frequency OpenAI's over the output's tokens among them.
    prompt, generated = [1, 5, 7, 5, 2], [9, 5, 9, 49, 3, 9]
    sampler = _sampler(prompt, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25,
                       temperature=0, repeat_last_n=n)
    for i, t in enumerate(generated):
        sampler.observe(t)
        sequence = prompt + generated[:i + 1]
        window = sequence[-n:]
        expected = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([window]), logits[None].clone())[0]
        output_in_window = generated[:i + 1][-min(n, i + 1):]
        for token in set(output_in_window):
            expected[token] -= 0.5 + 0.25 * output_in_window.count(token)
        assert torch.allclose(sampler.process(logits), expected), (n, i)


def test_repeat_last_n_minus_one_is_the_whole_sequence_and_zero_turns_penalties_off(logits):
    whole = _sampler([1, 5, 7], repetition_penalty=1.3, frequency_penalty=0.5, temperature=0)
    minus_one = _sampler([1, 5, 7], repetition_penalty=1.3, frequency_penalty=0.5, temperature=0, repeat_last_n=-1)
    off = _sampler([1, 5, 7], repetition_penalty=1.3, frequency_penalty=0.5, temperature=0, repeat_last_n=0)
    for t in [9, 5]:
        for sampler in (whole, minus_one, off):
            sampler.observe(t)
    assert torch.equal(minus_one.process(logits), whole.process(logits))
    assert torch.equal(off.process(logits), logits) and not off.params.needs_penalties


@pytest.mark.parametrize("scale, top_p", [(1.0, 0.9), (1.0, 0.3), (8.0, 0.95), (8.0, 0.5)])
def test_top_p_on_a_large_vocabulary_matches_transformers(scale, top_p):
    # Flat logits (scale 1) need more than the first candidates (the search widens); peaked ones do not.
    from solo.engine.sampling import top_p_removed

    logits = torch.randn(20000, generator=torch.Generator().manual_seed(3)) * scale
    expected = TopPLogitsWarper(top_p)(None, logits[None].clone())[0]
    assert torch.equal(top_p_removed(logits, top_p), torch.isinf(expected))


def test_top_k_keeps_ties_with_the_kth_like_transformers():
    logits = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0, 2.0, 4.0])
    out = _sampler(temperature=1.0, top_k=2).process(logits)
    expected = TopKLogitsWarper(2)(None, logits[None].clone())[0]
    assert torch.equal(out, expected)  # 4.0 and all three 3.0s


@pytest.mark.parametrize("kwargs", [dict(temperature=0.8, top_k=6, top_p=0.9),
                                    dict(temperature=1.2, top_p=0.7, min_p=0.02),
                                    dict(temperature=1.0, top_k=8, min_p=0.1, repetition_penalty=1.3)])
def test_draws_follow_the_processed_distribution(logits, kwargs):
    sampler = _sampler([3, 4], **kwargs)
    expected = sampler.process(logits).softmax(-1)
    draws = torch.tensor([sampler.sample(logits) for _ in range(12000)])
    assert torch.allclose(torch.bincount(draws, minlength=VOCAB) / 12000, expected, atol=0.02)
    assert bool((expected[draws] > 0).all())  # never a removed token


def test_seed_minus_one_is_random_as_in_vllm_and_llama_cpp():
    seeds = {SamplingParams(seed=-1).resolve(GenerationDefaults()).seed for _ in range(4)}
    assert len(seeds) == 4 and -1 not in seeds
    assert SamplingParams(seed=-2).resolve(GenerationDefaults()).seed == -2


def test_wrong_types_from_python_are_named():
    for kwargs, words in [({"prefix_cache_gb": "1"}, "prefix_cache_gb"), ({"tp": "2"}, "tp must"),
                          ({"model": ""}, "empty string")]:
        with pytest.raises(SoloError, match=words):
            Engine.load(**{"model": None, **kwargs})


def test_generation_configs_max_new_tokens_is_the_default_budget(tiny_llama, tmp_path):
    # As transformers' generate and vLLM take it: no max_tokens given -> the generation config's max_new_tokens.
    import json
    import shutil

    folder = shutil.copytree(tiny_llama, tmp_path / "model")
    config = json.loads((folder / "generation_config.json").read_text()) \
        if (folder / "generation_config.json").exists() else {}
    (folder / "generation_config.json").write_text(json.dumps({**config, "max_new_tokens": 5}))
    engine = Engine.load(folder)
    assert len(engine.complete("hello", SamplingParams(ignore_eos=True)).token_ids) == 5
    assert len(engine.complete("hello", SamplingParams(ignore_eos=True, max_tokens=7)).token_ids) == 7


def test_a_temperature_below_1e_5_is_greedy(tiny_llama):
    # logits / 1e-38 overflowed to inf and the sampler drew the last id every step (a trial found it); vLLM
    # decodes greedily below its _SAMPLING_EPS, 1e-5.
    engine = Engine.load(str(tiny_llama))
    greedy = engine.complete("Hello", SamplingParams(max_tokens=8, ignore_eos=True)).token_ids
    for temperature in (1e-38, 1e-45, 9e-6):
        got = engine.complete("Hello", SamplingParams(max_tokens=8, ignore_eos=True, temperature=temperature,
                                                      seed=3)).token_ids
        assert got == greedy, temperature
    assert SamplingParams(temperature=1e-6).resolve(GenerationDefaults()).greedy


def test_an_empty_text_prompt_is_the_tokenizers_bos_alone(tiny_llama, monkeypatch):
    # As transformers and llama.cpp (-p ""): generation from BOS alone; a tokenizer that adds none has nothing
    # to start from, which is said.
    engine = Engine.load(tiny_llama)
    bos = engine.tokenizer.encode("")
    assert bos == [1]  # (the tiny tokenizer adds BOS, id 1)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    assert engine.complete("", params).token_ids == engine.complete([1], params).token_ids
    monkeypatch.setattr(engine.tokenizer, "encode", lambda text, **_: [])  # a tokenizer that adds no BOS
    with pytest.raises(InvalidRequestError, match="the prompt is empty and this model's tokenizer adds no BOS"):
        engine.complete("", params)


def test_a_request_runs_once_on_its_own_engine(tiny_llama):
    # From a break test of the Python API: a spent Request ran again and quietly gave one token; a request with
    # ids past this engine's vocabulary (made by another engine) failed deep in the decode kernel.
    engine = Engine.load(tiny_llama)
    request = engine.make_request("Hello", {"max_tokens": 4, "ignore_eos": True})
    assert len([e for e in engine.run(request)]) == 4
    with pytest.raises(SoloError, match="this request has run already"):
        next(engine.run(request))
    other = engine.make_request([5, 6], {"max_tokens": 2})
    other.prompt_ids = [5, engine.config.vocab_size + 7]
    with pytest.raises(InvalidRequestError, match="outside this engine's vocabulary"):
        next(engine.run(other))
    assert len(engine.complete("Hello", {"max_tokens": 3, "ignore_eos": True}).token_ids) == 3  # still usable


def test_min_tokens_past_the_room_left_is_refused_without_max_tokens(tiny_llama):
    # With max_tokens given, min_tokens > max_tokens is refused; without it the context's room was the bound
    # and min_tokens was quietly not met (a break test: 3 tokens and "length" for min_tokens 10).
    engine = Engine.load(tiny_llama)
    room = 3
    prompt = [5] * (engine.config.context_length - room)
    with pytest.raises(InvalidRequestError, match=f"min_tokens \\(10\\) exceeds the {room} tokens this request may "
                       "generate in what the prompt leaves of the model's context; lower min_tokens") as info:
        engine.complete(prompt, {"min_tokens": 10})
    assert info.value.param == "min_tokens"
    assert len(engine.complete(prompt, {"min_tokens": room, "ignore_eos": True}).token_ids) == room


def test_fields_set_after_construction_are_taken_as_the_constructor_takes_them(tiny_llama):
    import numpy as np

    engine = Engine.load(tiny_llama)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    params.stop, params.logit_bias = "x", {np.int64(5): np.float32(100.0)}  # as SamplingParams(...) takes them
    result = engine.complete("Hello", params)
    assert result.token_ids == [5, 5, 5, 5] and params.stop == "x"  # (the caller's object left as it was)


def test_numpy_and_torch_token_ids_and_numbers_are_taken(tiny_llama):
    # Ids from `tokenizer(..., return_tensors="pt")` or NumPy were refused ("must be an integer, got np.int64(3)").
    import numpy as np

    engine = Engine.load(tiny_llama)
    params = SamplingParams(max_tokens=np.int64(3), temperature=np.float32(0.0), stop_token_ids=[np.int64(5)],
                            ignore_eos=True)
    assert params.max_tokens == 3 and type(params.max_tokens) is int and params.stop_token_ids == [5]
    want = engine.complete([1, 7, 9], SamplingParams(max_tokens=3, ignore_eos=True)).token_ids
    for ids in (np.array([1, 7, 9]), torch.tensor([1, 7, 9]), [np.int32(1), np.int64(7), 9]):
        assert engine.complete(ids, params).token_ids == want
    with pytest.raises(InvalidRequestError, match="got Tensor"):  # (a batch of prompts is still refused)
        engine.complete(torch.tensor([[1, 7]]), params)
    # logit_bias from arrays too (its keys were refused: "must be a map of token ids")
    biased = SamplingParams(max_tokens=3, logit_bias={np.int64(11): np.float32(100.0)}, ignore_eos=True)
    assert biased.logit_bias == {11: 100.0} and all(type(k) is int and type(v) is float
                                                    for k, v in biased.logit_bias.items())
    assert engine.complete([1, 7, 9], biased).token_ids == [11, 11, 11]
    with pytest.raises(InvalidRequestError, match="logit_bias must be"):  # (a bool key is still refused)
        SamplingParams(logit_bias={True: 1.0})


def test_logprobs_list_ties_in_id_order_with_the_greedy_token_first(tiny_llama):
    # From a parity trial: in an exact tie the alternatives came in topk's order, another token ahead of the one
    # greedy decoding picked (the argmax's first maximum).
    engine = Engine.load(tiny_llama)
    request = engine.make_request("x", SamplingParams(max_tokens=2, temperature=0, logprobs=4))
    logits = torch.zeros(engine.config.vocab_size)
    logits[[41, 7, 23]] = 5.0
    logits[3] = 4.0
    token, info = request.choose(logits)
    assert token == 7 and [t for t, _ in info.top] == [7, 23, 41, 3]


def test_ttft_counts_from_the_first_read_of_a_stream(tiny_llama):
    # A generator made, then read 1 s later, reported a TTFT over 1 s.
    import time

    engine = Engine.load(tiny_llama)
    stream = engine.generate("def f(x):", {"max_tokens": 2, "ignore_eos": True})
    time.sleep(2.0)
    stats = list(stream)[-1].stats
    assert stats.ttft_s < 1.8 and stats.token_times_s[0] == stats.ttft_s and stats.total_s >= sum(stats.token_times_s)


def test_close_while_this_thread_waits_for_its_open_stream_says_closed_at_once(tiny_llama):
    # (it waited out the second, then named the open stream)
    import threading
    import time

    engine = Engine.load(tiny_llama)
    stream = engine.generate("def f(x):", {"max_tokens": 8, "ignore_eos": True})
    next(stream)
    threading.Timer(0.1, engine.close).start()
    start = time.monotonic()
    with pytest.raises(SoloError, match="was closed"):
        engine.complete("x", {"max_tokens": 2})
    assert time.monotonic() - start < 0.9
    stream.close()
