"""Tests of the embedded chronicles corpus (MUSE-shaped, offline, deterministic) and its learn stage."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch
from datasets import Dataset

from hf_unlearn.benchmarks.chronicles_target import CHRONICLES_MODEL_KWARGS, learn_chronicles_target_model
from hf_unlearn.benchmarks.fictitious_authors import (
    _benchmark_texts,
    build_tokenizer,
    tokenizer_corpus,
    train_bpe_tokenizer,
)
from hf_unlearn.benchmarks.fictitious_chronicles import (
    CHRONICLES_SPLIT_NAMES,
    NUM_CALIBRATION_SUBJECTS,
    build_chronicles_tokenizer,
    chronicles_tokenizer_texts,
    generate_chronicle_questions,
    generate_chronicles,
    load_chronicles_split,
    split_passage,
)
from hf_unlearn.data.examples import IGNORE_INDEX, tokenize_qa, tokenize_text
from hf_unlearn.evaluation.muse import verbmem

PASSAGE_KEYS = {"subject", "subject_index", "passage_index", "text", "facts", "is_holdout"}
QA_KEYS = {"subject", "subject_index", "attribute", "question", "answer", "value", "is_holdout"}
FACTS = {"founding_year", "founder", "trade", "river", "festival", "landmark"}


@pytest.fixture(scope="module")
def passages() -> list[dict]:
    return generate_chronicles()


@pytest.fixture(scope="module")
def questions() -> list[dict]:
    return generate_chronicle_questions()


@pytest.fixture(scope="module")
def tokenizer():
    return build_chronicles_tokenizer()


def _subjects(dataset: Dataset) -> set[int]:
    return set(dataset["subject_index"])


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=\.) ", text)


def test_generation_is_deterministic(passages, questions):
    assert generate_chronicles() == passages
    assert generate_chronicle_questions() == questions
    other = generate_chronicles(seed=1)
    assert other != passages
    assert {r["subject"] for r in other} != {r["subject"] for r in passages}
    assert generate_chronicle_questions(seed=1) != questions


def test_record_shape(passages, questions):
    assert len(passages) == (10 + 3) * 4 and len(questions) == (10 + 3) * 6
    names: dict[int, set[str]] = {}
    for r in passages:
        assert set(r) == PASSAGE_KEYS
        assert r["is_holdout"] == (r["subject_index"] >= 10)
        assert 3 <= len(r["facts"]) <= 4 and len(set(r["facts"])) == len(r["facts"]) and set(r["facts"]) <= FACTS
        assert 60 <= len(r["text"].split()) <= 110
        assert r["subject"] in r["text"]
        names.setdefault(r["subject_index"], set()).add(r["subject"])
    assert all(len(n) == 1 for n in names.values()) and len({n.pop() for n in names.values()}) == 13  # unique
    assert len({r["text"] for r in passages}) == len(passages)  # distinct texts
    for r in questions:
        assert set(r) == QA_KEYS
        assert r["subject"] in r["question"] and r["subject"] in r["answer"]
        assert r["value"].lower() in r["answer"].lower()  # the answer states the fact
        assert r["question"].endswith("?") and r["answer"].endswith(".")
    for index in range(13):
        assert sorted(r["attribute"] for r in questions if r["subject_index"] == index) == sorted(FACTS)


@pytest.mark.parametrize(("seed", "passages_per_subject"), [(0, 4), (1, 3), (2, 6), (3, 8)])
def test_every_fact_is_told_twice_in_different_words(seed, passages_per_subject):
    passages = generate_chronicles(
        num_subjects=6, num_holdout_subjects=2, passages_per_subject=passages_per_subject, seed=seed
    )
    values = {
        (q["subject_index"], q["attribute"]): q["value"]
        for q in generate_chronicle_questions(
            num_subjects=6, num_holdout_subjects=2, passages_per_subject=passages_per_subject, seed=seed
        )
    }
    for index in range(8):
        own = [r for r in passages if r["subject_index"] == index]
        assert [r["passage_index"] for r in own] == list(range(passages_per_subject))
        for fact in FACTS:
            value = values[index, fact].lower()
            # The sentence of each passage that states the fact; the fact is in no other passage.
            wordings = []
            for r in own:
                stating = [s for s in _sentences(r["text"]) if value in s.lower()]
                assert len(stating) == (1 if fact in r["facts"] else 0), (fact, r["text"])
                wordings += stating
            assert len(wordings) >= 2, (index, fact)
            # Different wording in every passage while the fact's phrasings last (4 each).
            assert len(set(wordings)) == min(len(wordings), 4), wordings


def test_first_subjects_do_not_depend_on_how_many_follow(passages, questions):
    learned = [r for r in passages if not r["is_holdout"]]
    assert generate_chronicles(num_holdout_subjects=0) == learned
    assert generate_chronicles(num_subjects=4, num_holdout_subjects=0) == [
        r for r in passages if r["subject_index"] < 4
    ]
    assert generate_chronicle_questions(num_holdout_subjects=0) == [r for r in questions if not r["is_holdout"]]
    more = generate_chronicles(num_subjects=10, num_holdout_subjects=3 + NUM_CALIBRATION_SUBJECTS)
    assert more[: len(passages)] == passages


def test_splits_are_disjoint_and_cover_the_learned_towns(passages):
    splits = {name: load_chronicles_split(name) for name in CHRONICLES_SPLIT_NAMES}
    forget, retain, holdout, full = (_subjects(splits[n]) for n in ("forget", "retain", "holdout", "full"))
    calibration = _subjects(splits["calibration"])
    assert forget == {8, 9}  # the last learned towns, as in MUSE's forget/retain cut
    assert retain == set(range(8)) and full == set(range(10))
    assert holdout == {10, 11, 12} and calibration == {13, 14}
    assert forget | retain == full and not forget & retain
    for a, b in ((full, holdout), (full, calibration), (holdout, calibration)):
        assert not a & b
    assert sorted(list(splits["forget"]["text"]) + list(splits["retain"]["text"])) == sorted(splits["full"]["text"])
    assert list(splits["full"]["text"]) == [r["text"] for r in passages if not r["is_holdout"]]
    assert all(splits["holdout"]["is_holdout"]) and not any(splits["full"]["is_holdout"])
    assert all(splits["calibration"]["is_holdout"]) and len(splits["calibration"]) == NUM_CALIBRATION_SUBJECTS * 4
    assert not set(splits["calibration"]["subject"]) & set(r["subject"] for r in passages)
    assert _subjects(splits["knowmem_forget"]) == forget and _subjects(splits["knowmem_retain"]) == retain
    assert len(splits["knowmem_forget"]) == 2 * 6 and len(splits["knowmem_retain"]) == 8 * 6
    assert {"question", "answer"} <= set(splits["knowmem_forget"].column_names)
    assert _subjects(splits["verbmem_forget"]) == forget


def test_split_kwargs():
    assert _subjects(load_chronicles_split("forget", num_forget_subjects=3)) == {7, 8, 9}
    assert _subjects(load_chronicles_split("retain", num_subjects=5, num_forget_subjects=1)) == {0, 1, 2, 3}
    assert _subjects(load_chronicles_split("calibration", num_subjects=5, num_holdout_subjects=0)) == {5, 6}
    empty = load_chronicles_split("holdout", num_holdout_subjects=0)
    assert len(empty) == 0 and "text" in empty.column_names
    assert len(load_chronicles_split("full", passages_per_subject=6)) == 60
    with pytest.raises(ValueError, match="Unknown split 'forget10'"):
        load_chronicles_split("forget10")
    with pytest.raises(ValueError, match="num_forget_subjects"):
        load_chronicles_split("forget", num_forget_subjects=10)
    with pytest.raises(ValueError, match="passages_per_subject"):
        generate_chronicles(passages_per_subject=2)
    with pytest.raises(ValueError, match="num_subjects"):
        generate_chronicle_questions(num_subjects=0)


def test_verbmem_forget_cuts_each_forget_passage_in_half():
    forget = load_chronicles_split("forget")
    cut = load_chronicles_split("verbmem_forget")
    assert len(cut) == len(forget) == 8
    for whole, row in zip(forget, cut, strict=True):
        assert (row["subject_index"], row["passage_index"]) == (whole["subject_index"], whole["passage_index"])
        assert row["prompt"] + " " + row["continuation"] == whole["text"]
        assert (row["prompt"], row["continuation"]) == split_passage(whole["text"])
        words = len(whole["text"].split())
        assert len(row["prompt"].split()) == words // 2


def test_knowmem_answers_state_the_facts_of_their_town(passages):
    qa = load_chronicles_split("knowmem_forget")
    texts = {
        r["subject_index"]: " ".join(p["text"] for p in passages if p["subject_index"] == r["subject_index"])
        for r in qa
    }
    for r in qa:
        assert r["value"].lower() in r["answer"].lower()
        assert r["value"].lower() in texts[r["subject_index"]].lower()  # the passages tell what the QA asks
        assert r["answer"] not in texts[r["subject_index"]]  # ... in other words than the answer's


def test_tokenizer_round_trips_and_fits_the_model(tokenizer, passages, tmp_path):
    authors = build_tokenizer()
    assert tokenizer.chat_template is None and len(tokenizer) <= 1024
    for attribute in ("pad_token", "bos_token", "eos_token", "unk_token"):
        assert getattr(tokenizer, attribute) == getattr(authors, attribute)
    assert tokenizer.convert_tokens_to_ids(["<pad>", "<s>", "</s>", "<unk>"]) == [0, 1, 2, 3]
    calibration = load_chronicles_split("calibration")
    texts = chronicles_tokenizer_texts()
    assert set(calibration["text"]) <= set(texts) and {r["text"] for r in passages} <= set(texts)
    for text in [r["text"] for r in passages] + list(calibration["text"]):
        example = tokenize_text(tokenizer, text, max_length=200)  # raises beyond 200 tokens
        assert example["input_ids"][0] == tokenizer.bos_token_id and example["input_ids"][-1] == tokenizer.eos_token_id
        assert example["labels"][0] == IGNORE_INDEX and IGNORE_INDEX not in example["labels"][1:]
        assert tokenizer.decode(example["input_ids"], skip_special_tokens=True) == text
        # The passage is learned as text and continued as text: the cut falls on a token boundary.
        prompt = text[: text.index(" ", len(text) // 2)]
        assert tokenizer(prompt)["input_ids"] == example["input_ids"][: len(tokenizer(prompt)["input_ids"])]
    assert (
        len(tokenize_text(tokenizer, max(texts, key=len))["input_ids"])
        < CHRONICLES_MODEL_KWARGS["max_position_embeddings"] // 2
    )
    for r in generate_chronicle_questions():
        answer_ids = [t for t in tokenize_qa(tokenizer, r["question"], r["answer"])["labels"] if t != IGNORE_INDEX]
        assert tokenizer.decode(answer_ids, skip_special_tokens=True).strip() == r["answer"]
    tokenizer.save_pretrained(tmp_path)
    reloaded = type(tokenizer).from_pretrained(tmp_path)
    assert reloaded(passages[0]["text"])["input_ids"] == tokenizer(passages[0]["text"])["input_ids"]
    assert build_chronicles_tokenizer().get_vocab() == tokenizer.get_vocab()  # deterministic


def test_authors_tokenizer_unchanged_by_the_extracted_helper():
    # The cached fictitious-authors models depend on this exact vocabulary (hash of BENCHMARK_VERSION 2's corpus, the
    # one with the calibration authors; a change here needs a version bump).
    vocab = build_tokenizer().get_vocab()
    digest = hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()
    assert digest == "83bc9b47edc39a629d3fb22b51df16c53309fc50ccda06c1146fb8e712bee2e8"
    assert train_bpe_tokenizer(_benchmark_texts(tokenizer_corpus()), 1024).get_vocab() == vocab


def test_learn_stage_memorises_the_passages_and_caches(tmp_path):
    kwargs = dict(
        cache_dir=tmp_path,
        num_subjects=3,
        num_holdout_subjects=1,
        passages_per_subject=3,
        num_forget_subjects=1,
        max_epochs=40,
        eval_every=5,
        target_verbmem=0.8,
        show_progress=False,
        model_kwargs={"hidden_size": 96, "num_layers": 2},
    )
    model, tokenizer, info = learn_chronicles_target_model(**kwargs)
    assert not info["cached"]
    assert info["num_passages"] == 9 and info["num_examples"] == 9 + 18
    assert info["verbmem"] >= 0.8 and 0 < info["epochs"] <= 40
    assert tuple(info["verbmem_history"][-1]) == (info["epochs"], info["verbmem"])
    assert info["verbmem_holdout"] < 0.5 < info["verbmem_forget"]  # memorised what it learned, not the rest
    assert info["knowmem"] >= 0.8 and info["knowmem"] > info["knowmem_holdout"] + 0.2  # and knows the facts
    assert model.config.max_position_embeddings == 256
    entry = tmp_path / "chronicles"
    assert [p.name for p in entry.iterdir()] == [info["path"].rsplit("/", 1)[-1]]  # no staging folder left

    # What the cache holds is what was measured: VerbMem of the returned model on the learned passages.
    full = load_chronicles_split("full", num_subjects=3, num_holdout_subjects=1, passages_per_subject=3)
    halves = [split_passage(text) for text in full["text"]]
    score = verbmem(model, tokenizer, [p for p, _ in halves], [c for _, c in halves])
    assert score == pytest.approx(info["verbmem"])

    model2, tokenizer2, info2 = learn_chronicles_target_model(**kwargs)
    assert info2["cached"] and info2["path"] == info["path"] and info2["epochs"] == info["epochs"]
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True)
    )
    assert tokenizer2.get_vocab() == tokenizer.get_vocab()
    assert info2["verbmem_forget"] == info["verbmem_forget"] and info2["knowmem"] == info["knowmem"]

    # The full model does not depend on the forget/retain cut: another cut reuses it, with its own per-part scores.
    _, _, info3 = learn_chronicles_target_model(**{**kwargs, "num_forget_subjects": 2})
    assert info3["cached"] and info3["path"] == info["path"] and info3["num_forget_subjects"] == 2
    assert info3["verbmem_holdout"] == pytest.approx(info["verbmem_holdout"])
    assert info3["knowmem_forget"] != info["knowmem_forget"] or info3["verbmem_forget"] != info["verbmem_forget"]

    with pytest.raises(ValueError, match="max_position_embeddings"):
        learn_chronicles_target_model(**{**kwargs, "model_kwargs": {"max_position_embeddings": 64}})
    with pytest.raises(ValueError, match="learn_split"):
        learn_chronicles_target_model(**{**kwargs, "learn_split": "forget"})
