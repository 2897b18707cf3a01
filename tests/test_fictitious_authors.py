"""Tests of the embedded fictitious-authors benchmark (offline, deterministic)."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset

from hf_unlearn.benchmarks import (
    SPLIT_NAMES,
    build_tokenizer,
    generate_benchmark,
    learn_target_model,
    load_split,
    tiny_model,
    tiny_model_config,
)
from hf_unlearn.benchmarks.fictitious_authors import benchmark_size, tokenizer_corpus
from hf_unlearn.benchmarks.target_model import _sft_trainer
from hf_unlearn.data.examples import IGNORE_INDEX, tokenize_qa

RECORD_KEYS = {"author", "author_index", "question", "answer", "paraphrased_answer", "perturbed_answer", "is_holdout"}


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return generate_benchmark()


@pytest.fixture(scope="module")
def tokenizer(records):
    return build_tokenizer(records)


def test_generation_is_deterministic(records):
    assert generate_benchmark() == records
    assert generate_benchmark(seed=1) != records
    assert {r["author"] for r in generate_benchmark(seed=1)} != {r["author"] for r in records}


def test_record_shape(records):
    assert len(records) == (40 + 4) * 5
    for r in records:
        assert RECORD_KEYS <= set(r)
        assert r["author"] in r["question"] and r["author"] in r["answer"]
        assert r["paraphrased_answer"] != r["answer"]
        assert len(r["perturbed_answer"]) == 3 and len(set(r["perturbed_answer"])) == 3
        assert r["answer"] not in r["perturbed_answer"]
        assert r["paraphrased_answer"] not in r["perturbed_answer"]
        assert r["is_holdout"] == (r["author_index"] >= 40)
    authors = {}
    for r in records:
        authors.setdefault(r["author_index"], set()).add(r["author"])
    assert all(len(names) == 1 for names in authors.values())
    assert len({next(iter(names)) for names in authors.values()}) == 44  # unique names
    for index in authors:
        questions = [r["question"] for r in records if r["author_index"] == index]
        assert len(set(questions)) == 5
        attributes = [r["attribute"] for r in records if r["author_index"] == index]
        assert len(set(attributes)) == 5  # different attributes


def test_learned_authors_do_not_depend_on_holdout_count(records):
    learned = [r for r in records if not r["is_holdout"]]
    assert [r for r in generate_benchmark(num_holdout_authors=0)] == learned


def test_invalid_arguments():
    with pytest.raises(ValueError, match="questions_per_author"):
        generate_benchmark(questions_per_author=99)
    with pytest.raises(ValueError, match="forget10"):
        load_split("forget50")


def _authors(dataset: Dataset) -> set[int]:
    return set(dataset["author_index"])


def test_split_sizes_and_disjointness():
    splits = {name: load_split(name) for name in SPLIT_NAMES}
    assert len(_authors(splits["forget01"])) == 1
    assert len(_authors(splits["forget05"])) == 2
    assert len(_authors(splits["forget10"])) == 4
    assert _authors(splits["forget10"]) == {36, 37, 38, 39}  # the last learned authors, as in TOFU
    assert len(splits["full"]) == 200 and len(splits["holdout"]) == 20
    full = _authors(splits["full"])
    for forget, retain in (("forget01", "retain99"), ("forget05", "retain95"), ("forget10", "retain90")):
        assert _authors(splits[forget]) | _authors(splits[retain]) == full
        assert not _authors(splits[forget]) & _authors(splits[retain])
        assert len(splits[forget]) + len(splits[retain]) == len(splits["full"])
    assert not _authors(splits["holdout"]) & full
    assert all(splits["holdout"]["is_holdout"]) and not any(splits["full"]["is_holdout"])


def test_the_judge_size_has_64_authors_on_each_side_of_the_membership_attack():
    # issue 66: an author's answers share the author's name, so an interval resamples authors; a paired AUC difference
    # is judged at ±0.1 only with about 64 authors a side.
    settings = benchmark_size("judge")
    sides = {name: load_split(name, **settings) for name in ("forget10", "holdout", "calibration", "retain90")}
    assert {name: len(data) for name, data in sides.items()} == {
        "forget10": 320, "holdout": 320, "calibration": 320, "retain90": 2880
    }  # fmt: skip
    assert {name: len(_authors(data)) for name, data in sides.items()} == {
        "forget10": 64, "holdout": 64, "calibration": 64, "retain90": 576
    }  # fmt: skip
    never_learned = _authors(sides["holdout"]) | _authors(sides["calibration"])
    assert len(never_learned) == 128 and not never_learned & _authors(load_split("full", **settings))
    # every author is in the tokenizer's corpus, the 64 calibration ones too (issue 66: as the learned ones are)
    corpus = {r["author"] for r in tokenizer_corpus(**settings)}
    assert set(sides["calibration"]["author"]) | set(sides["holdout"]["author"]) <= corpus
    # The calibration count changes no other split, and the quick size is the default.
    assert list(load_split("holdout", **dict(settings, num_calibration_authors=3))["question"]) == list(
        sides["holdout"]["question"]
    )
    assert len(load_split("calibration", **benchmark_size("quick"))) == len(load_split("calibration")) == 20
    with pytest.raises(ValueError, match="Unknown benchmark size 'huge'; choose one of quick, judge"):
        benchmark_size("huge")


def test_split_generate_kwargs():
    assert len(_authors(load_split("forget10", num_authors=20))) == 2
    assert len(load_split("holdout", num_holdout_authors=0)) == 0
    # The seed reaches the generator: seed 3's split holds seed 3's learned records, not the default seed's.
    seeded = generate_benchmark(seed=3)
    assert list(load_split("full", seed=3)["question"]) == [r["question"] for r in seeded if not r["is_holdout"]]
    assert list(load_split("holdout", seed=3)["question"]) == [r["question"] for r in seeded if r["is_holdout"]]
    assert list(load_split("full", seed=3)["question"]) != list(load_split("full")["question"])


def test_tokenizer_round_trips(records, tokenizer, tmp_path):
    assert tokenizer.chat_template is None
    assert len(tokenizer) <= 1024
    assert {tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token} == {
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
    }
    ids = tokenizer("Hello there")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and tokenizer.eos_token_id not in ids
    assert tokenizer("Hello there", add_special_tokens=False)["input_ids"] == ids[1:]
    for r in records:
        for text in (r["answer"], r["paraphrased_answer"], *r["perturbed_answer"]):
            assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text
        example = tokenize_qa(tokenizer, r["question"], r["answer"])
        answer_ids = [t for t in example["labels"] if t != IGNORE_INDEX]
        assert answer_ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(answer_ids, skip_special_tokens=True).strip() == r["answer"]
    tokenizer.save_pretrained(tmp_path)
    reloaded = type(tokenizer).from_pretrained(tmp_path)
    assert (
        reloaded("Where was Veloran Quist born?")["input_ids"]
        == tokenizer("Where was Veloran Quist born?")["input_ids"]
    )


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_tiny_model_forward(tokenizer, architecture):
    config = tiny_model_config(tokenizer, architecture)
    assert config.vocab_size == len(tokenizer)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    model = tiny_model(tokenizer, architecture, seed=0)
    assert sum(p.numel() for p in model.parameters()) < 3_000_000
    batch = tokenizer(["Where was Veloran Quist born?", "Hi"], padding=True, return_tensors="pt")
    out = model(**batch, labels=batch["input_ids"])
    assert out.logits.shape == (2, batch["input_ids"].shape[1], len(tokenizer))
    assert torch.isfinite(out.loss)
    again = tiny_model(tokenizer, architecture, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))


def test_unknown_architecture(tokenizer):
    with pytest.raises(ValueError, match="architecture"):
        tiny_model_config(tokenizer, "bert")


def test_sft_trainer_masks_prompt(records, tokenizer, tmp_path):
    examples = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in records[:8]]
    trainer = _sft_trainer(
        tiny_model(tokenizer),
        tokenizer,
        Dataset.from_list(examples),
        str(tmp_path),
        max_epochs=1,
        learning_rate=1e-3,
        batch_size=8,
        seed=0,
        show_progress=False,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    by_ids = {tuple(e["input_ids"]): e["labels"] for e in examples}
    for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True):
        length = int(mask.sum())
        expected = by_ids[tuple(ids[:length].tolist())]
        assert labels[:length].tolist() == expected  # the prompt keeps -100: no loss on it
        assert set(labels[length:].tolist()) <= {IGNORE_INDEX}


@pytest.mark.slow
def test_learn_target_model_reaches_target_and_caches(tmp_path):
    kwargs = dict(cache_dir=tmp_path, num_authors=20, max_epochs=60, target_exact_match=0.95, show_progress=False)
    model, tokenizer, info = learn_target_model(**kwargs)
    assert not info["cached"]
    assert info["exact_match"] >= 0.95
    assert info["num_examples"] == 100
    assert 0 < info["epochs"] <= 60
    entry = tmp_path / "fictitious_authors"
    assert [p.name for p in entry.iterdir()] == [info["path"].rsplit("/", 1)[-1]]  # no temporary folder left
    saved = json.loads((entry / info["path"].rsplit("/", 1)[-1] / "info.json").read_text())
    assert saved["exact_match"] == info["exact_match"]

    model2, tokenizer2, info2 = learn_target_model(**kwargs)
    assert info2["cached"] and info2["path"] == info["path"]
    assert info2["exact_match"] == info["exact_match"] and info2["epochs"] == info["epochs"]
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True)
    )
    question = "Where was Veloran Quist born?"
    assert tokenizer2(question)["input_ids"] == tokenizer(question)["input_ids"]

    from hf_unlearn.evaluation.metrics import evaluate_qa

    scores = evaluate_qa(model2, tokenizer2, load_split("full", num_authors=20))
    assert scores["exact_match"] == pytest.approx(info["exact_match"])
    assert scores["num_examples"] == 100

    _, _, other = learn_target_model(**{**kwargs, "max_epochs": 1})  # another setting, another cache entry
    assert not other["cached"] and other["path"] != info["path"]


def test_two_callers_at_once_learn_the_model_once(tmp_path):
    """Two threads ask for the same uncached model at once (as two processes of a study, or pytest-xdist's workers,
    do): the cache's lock lets one learn while the other waits and then loads its entry."""
    from concurrent.futures import ThreadPoolExecutor

    kwargs = dict(cache_dir=tmp_path, num_authors=4, max_epochs=1, target_exact_match=0.0, show_progress=False)
    kwargs["model_kwargs"] = {"hidden_size": 32, "num_layers": 1, "num_heads": 2}
    with ThreadPoolExecutor(2) as pool:
        infos = [future.result()[2] for future in [pool.submit(learn_target_model, **kwargs) for _ in range(2)]]
    assert sorted(info["cached"] for info in infos) == [False, True]
    assert infos[0]["path"] == infos[1]["path"]


def test_learning_through_lora_saves_a_merged_plain_model(tmp_path):
    kwargs = dict(cache_dir=tmp_path, num_authors=4, max_epochs=2, target_exact_match=0.0, show_progress=False)
    small = {"hidden_size": 32, "num_layers": 1, "num_heads": 2}
    plain, _, plain_info = learn_target_model(**kwargs, model_kwargs=small)
    merged, tokenizer, info = learn_target_model(**kwargs, model_kwargs=small, lora_r=4, learning_rate=1e-2)
    assert info["settings"]["lora_r"] == 4 and "lora_r" not in plain_info["settings"]
    assert not hasattr(merged, "peft_config") and type(merged) is type(plain)  # no adapter left to carry around
    assert not any("lora" in name for name in merged.state_dict())
    # The learned adapters are in the saved weights: against the base it started from (same seed), every linear
    # layer of the decoder (LoRA's "all-linear") moved, and nothing else did (only the adapters trained).
    base = tiny_model(tokenizer, "llama", seed=0, **small).state_dict()
    weights = merged.state_dict()
    linear = {f"{name}.weight" for name, module in merged.named_modules() if isinstance(module, torch.nn.Linear)}
    linear.discard("lm_head.weight")  # all-linear leaves the output layer out
    assert len(linear) == 7  # q, k, v, o, gate, up, down of the one layer
    for name, value in weights.items():
        assert torch.equal(value, base[name]) != (name in linear), name
    assert merged.config.use_cache and plain.config.use_cache  # TRL turned it off for training only
    with pytest.raises(ValueError, match="Unknown base_model 'gpt9'; available: smollm2"):
        learn_target_model(**kwargs, base_model="gpt9")


@pytest.mark.parametrize("size", ["quick", "judge"])
def test_calibration_authors_are_tokenized_like_the_other_never_learned_authors(size):
    # A stop calibrated on never-seen authors compares the forget set with them; if the tokenizer had learned every
    # name but theirs, their answers would split into more, rarer pieces and look less familiar than any never-seen
    # author (before BENCHMARK_VERSION 2: 13.4 tokens an answer against the holdout authors' 9.0). At the judge size
    # the calibration authors must be in the corpus too (issue 66: authors generated past the corpus tokenized at 3.1
    # characters a token against the learned ones' 4.2).
    settings = benchmark_size(size)
    tokenizer = build_tokenizer(tokenizer_corpus(**settings))

    def tokens_per_answer(split: str) -> float:
        answers = load_split(split, **settings)["answer"]
        return sum(len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers) / len(answers)

    holdout, calibration, forget = (tokens_per_answer(s) for s in ("holdout", "calibration", "forget10"))
    assert abs(calibration - holdout) <= 0.1 * holdout, (calibration, holdout)
    assert abs(forget - holdout) <= 0.1 * holdout, (forget, holdout)
