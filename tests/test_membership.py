"""Membership attacks and PrivLeak: each attack against a hand computation on a tiny model, MUSE's AUC orientation
and token count, batched scoring equal to one text at a time, and the forward attacks read from the answer metrics'
teacher-forced pass (Llama, Qwen2, GPT-2; padding, mixed lengths) with the values of their own forward."""

import math
import zlib

import pytest
import torch

from hf_unlearn.benchmarks import build_tokenizer, generate_benchmark, tiny_model
from hf_unlearn.data.prompts import prompt_and_completion
from hf_unlearn.evaluation.bundle import measure_qa_sets, qa_membership_auc
from hf_unlearn.evaluation.membership import (
    ATTACKS,
    FORWARD_ATTACKS,
    attack_reads,
    membership_auc,
    membership_scores,
    min_k_percent,
    min_k_plus_plus,
    privleak,
    token_statistics,
)
from hf_unlearn.evaluation.scoring import score_qa_records
from hf_unlearn.evaluation.suites import evaluate_benchmark, qa_evaluation_sets

TEXTS = ["Question: who?\nAnswer: nobody at all", "short", "A somewhat longer text about an author and a book."]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(generate_benchmark(num_authors=8), vocab_size=512)


def test_min_k_takes_museS_int_of_k_n_lowest_tokens():
    log_probs = torch.tensor([-0.1, -5.0, -0.2, -3.0, -0.3])
    # int(0.4 * 5) = 2 lowest: -5 and -3.
    assert min_k_percent(log_probs, 0.4) == pytest.approx(-4.0)
    # int(0.5 * 5) = 2 (MUSE truncates; ceil would take 3).
    assert min_k_percent(log_probs, 0.5) == pytest.approx(-4.0)
    assert min_k_percent(log_probs, 0.7) == pytest.approx((-5.0 - 3.0 - 0.3) / 3)
    assert min_k_percent(log_probs, 1.0) == pytest.approx(log_probs.mean().item())
    assert min_k_percent(torch.tensor([-2.0, -1.0]), 0.4) == pytest.approx(-2.0)  # int(0.8) = 0: at least one
    with pytest.raises(ValueError, match="k must be in"):
        min_k_percent(log_probs, 0.0)


def test_min_k_plus_plus_standardises_before_selecting():
    log_probs = torch.tensor([-1.0, -2.0, -3.0, -1.0, -1.0])
    mean = torch.tensor([-1.5, -1.0, -4.0, -1.0, -2.0])
    std = torch.tensor([0.5, 1.0, 2.0, 1.0, 1.0])
    # z = [1.0, -1.0, 0.5, 0.0, 1.0]; the lowest int(0.4 * 5) = 2 are -1.0 and 0.0.
    assert min_k_plus_plus(log_probs, mean, std, 0.4) == pytest.approx(-0.5)


def test_auc_and_privleak_in_museS_orientation():
    """Forget texts are labelled 0, holdout texts 1: AUC = P(holdout score > forget score). A model that still
    remembers the forget set (forget scores above every holdout score) has AUC 0 and PrivLeak -100 against a
    retrained model at 0.5; MUSE's reading: strongly negative is under-unlearning."""
    forget, holdout = [0.9, 0.8, 0.3], [0.5, 0.2]
    pairs = [(h > f) + 0.5 * (h == f) for f in forget for h in holdout]
    assert membership_auc(forget, holdout) == pytest.approx(sum(pairs) / len(pairs)) == pytest.approx(1 / 6)
    remembered = membership_auc([-0.1, -0.2, -0.3], [-2.0, -3.0, -2.5])
    assert remembered == 0.0
    assert privleak(remembered, 0.5) == -100.0
    over_unlearned = membership_auc([-9.0, -8.0], [-2.0, -3.0])
    assert over_unlearned == 1.0 and privleak(over_unlearned, 0.5) == 100.0
    assert membership_auc([1.0, 1.0], [1.0]) == pytest.approx(0.5)
    assert privleak(0.5, 0.5) == 0.0
    with pytest.raises(ValueError, match="at least one forget score"):
        membership_auc([], [0.1])


def _hand_log_probs(model, ids, start=1):
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].double(), dim=-1)
    targets = torch.tensor(ids[1:])
    chosen = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen[start - 1 :], log_probs[start - 1 :]


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_every_attack_equals_a_hand_computation(tokenizer, architecture):
    model = tiny_model(tokenizer, architecture, hidden_size=32, num_layers=2, num_heads=2)
    reference = tiny_model(tokenizer, architecture, seed=1, hidden_size=32, num_layers=2, num_heads=2)
    prompts = ["Question: who?\nAnswer:", "Q:", "Tell me:"]
    texts = [" nobody at all", " short", " a somewhat longer text about an author and a book."]
    scores = membership_scores(
        model, tokenizer, texts, k=0.4, batch_size=3, prompts=prompts, attacks=ATTACKS, reference_model=reference
    )
    assert set(scores) == set(ATTACKS)
    for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
        head = tokenizer(prompt)["input_ids"]
        ids = head + tokenizer(text, add_special_tokens=False)["input_ids"]
        chosen, log_probs = _hand_log_probs(model, ids, start=len(head))
        n = chosen.numel()
        assert scores["loss"][i] == pytest.approx(chosen.mean().item(), abs=1e-3)
        assert scores["zlib"][i] == pytest.approx(chosen.sum().item() / len(zlib.compress(text.encode())), abs=1e-3)
        lowest = torch.sort(chosen).values[: max(1, int(0.4 * n))]
        assert scores["min_k"][i] == pytest.approx(lowest.mean().item(), abs=1e-3)
        probs = log_probs.exp()
        mu = (probs * log_probs).sum(-1)
        sigma = (probs * (log_probs - mu.unsqueeze(-1)).square()).sum(-1).sqrt()
        z = torch.sort((chosen - mu) / sigma).values[: max(1, int(0.4 * n))]
        assert scores["min_k_plus_plus"][i] == pytest.approx(z.mean().item(), abs=1e-3)
        reference_chosen, _ = _hand_log_probs(reference, ids, start=len(head))
        assert scores["reference"][i] == pytest.approx(chosen.mean().item() - reference_chosen.mean().item(), abs=1e-3)
        # GradNorm: the gradient of the mean NLL of the text's tokens, all parameters, one L2 norm.
        model.zero_grad()
        labels = torch.tensor([[-100] * len(head) + ids[len(head) :]])
        model(input_ids=torch.tensor([ids]), labels=labels).loss.backward()
        norm = math.sqrt(sum(p.grad.double().square().sum().item() for p in model.parameters() if p.grad is not None))
        assert scores["gradnorm"][i] == pytest.approx(-norm, rel=1e-4)
        model.zero_grad()
    assert all(p.grad is None for p in model.parameters())  # GradNorm leaves no gradients behind
    # A frozen model (a merged adapter, a reference) is attacked on its weights too, and stays frozen.
    model.requires_grad_(False)
    frozen = membership_scores(model, tokenizer, texts, prompts=prompts, attacks=["gradnorm"])["gradnorm"]
    assert frozen == pytest.approx(scores["gradnorm"], rel=1e-4)
    assert not any(p.requires_grad for p in model.parameters())


def test_unknown_attack_and_reference_without_model_are_named(tokenizer):
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="Unknown membership attack"):
        membership_scores(model, tokenizer, ["x"], attacks=["lira"])
    with pytest.raises(ValueError, match="pass reference_model"):
        membership_scores(model, tokenizer, ["x"], attacks=["reference"])


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_batched_token_statistics_match_one_text_at_a_time(tokenizer, architecture):
    model = tiny_model(tokenizer, architecture, hidden_size=32, num_layers=2, num_heads=2)
    batched = token_statistics(model, tokenizer, TEXTS, batch_size=3)
    for text, got in zip(TEXTS, batched, strict=True):
        ids = tokenizer(text)["input_ids"]
        expected, log_probs = _hand_log_probs(model, ids)
        assert torch.allclose(got["log_prob"].double(), expected, atol=1e-4)
        probs = log_probs.exp()
        mean = (probs * log_probs).sum(-1)
        std = ((probs * (log_probs - mean.unsqueeze(-1)).square()).sum(-1)).sqrt()
        assert torch.allclose(got["mean"].double(), mean, atol=1e-4)
        assert torch.allclose(got["std"].double(), std, atol=1e-4)


# The forward attacks read the teacher-forced pass of the answer metrics (evaluation/passes.py) where it ran over the
# texts' very tokens: the same values as their own forward, without it.

SMALL = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return generate_benchmark(num_authors=4, num_holdout_authors=0)


def attack_texts(tokenizer, rows, template=None) -> tuple[list[str], list[str]]:
    """The completions and prompts the QA membership attack scores (what qa_evaluation_sets and compare build)."""
    pairs = [prompt_and_completion(tokenizer, r["question"], r["answer"], template) for r in rows]
    return [c for _, c in pairs], [p for p, _ in pairs]


def attack_sequences(tokenizer, rows, template=None) -> list[tuple[int, ...]]:
    """The token sequences an attack's own forward runs over: the prompt with special tokens (none when it begins
    with the BOS already), the text without."""
    texts, prompts = attack_texts(tokenizer, rows, template)
    bos = tokenizer.bos_token or "\0"
    return [
        tuple(
            tokenizer(p, add_special_tokens=not p.startswith(bos))["input_ids"]
            + tokenizer(t, add_special_tokens=False)["input_ids"]
        )
        for t, p in zip(texts, prompts, strict=True)
    ]


def forwarded_rows(model) -> list[tuple[int, ...]]:
    """Every unpadded row of every forward without labels (GradNorm's backward forwards pass labels)."""
    rows: list[tuple[int, ...]] = []

    def record(module, args, kwargs):
        if kwargs.get("labels") is not None:
            return
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        for row, row_mask in zip(ids.tolist(), (mask if mask is not None else torch.ones_like(ids)).tolist()):
            rows.append(tuple(token for token, kept in zip(row, row_mask) if kept))

    model.register_forward_pre_hook(record, with_kwargs=True)
    return rows


def assert_same_scores(new: dict, old: dict) -> None:
    assert set(new) == set(old)
    for attack in old:
        assert new[attack] == pytest.approx(old[attack], rel=1e-4, abs=1e-5), attack


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_forward_attacks_read_the_scoring_pass_and_give_their_own_forwards_values(tokenizer, records, architecture):
    from conftest import train_on_answers

    model = tiny_model(tokenizer, architecture, seed=11, **SMALL)
    train_on_answers(model, tokenizer, records[:8], steps=40, lr=1e-2)  # members memorised, the others not
    members, others = records[:9], records[9:16]
    texts, prompts = attack_texts(tokenizer, members)
    assert len({len(t) for t in texts}) > 2  # answers of mixed lengths
    # batches of 4 (4 + 4 + 1), right-padded, against the attack's own batches of 3
    scored = score_qa_records(model, tokenizer, members, batch_size=4, reads=attack_reads(FORWARD_ATTACKS))
    old = membership_scores(model, tokenizer, texts, batch_size=3, prompts=prompts)
    other_texts, other_prompts = attack_texts(tokenizer, others)
    old_others = membership_scores(model, tokenizer, other_texts, batch_size=3, prompts=other_prompts)
    rows = forwarded_rows(model)
    new = membership_scores(model, tokenizer, texts, batch_size=3, prompts=prompts, scored=scored)
    assert rows == []  # no forward: every text was read from the pass
    assert_same_scores(new, old)
    assert scored[0].token_log_probs.numel() == len(tokenizer(texts[0], add_special_tokens=False)["input_ids"]) + 1
    # the never-seen answers are not in the pass: their own forward, the same AUCs
    new_others = membership_scores(model, tokenizer, other_texts, batch_size=3, prompts=other_prompts, scored=scored)
    assert sorted(rows) == sorted(attack_sequences(tokenizer, others))
    assert_same_scores(new_others, old_others)
    for attack in FORWARD_ATTACKS:
        assert membership_auc(new[attack], new_others[attack]) == membership_auc(old[attack], old_others[attack])
    assert membership_auc(old["loss"], old_others["loss"]) < 0.5  # the members are recognised: a real signal
    # a mixed call reads what it can and runs a forward over the rest only; a pass without the moments cannot give
    # Min-K%++, so those texts get their own forward
    rows.clear()
    mixed = membership_scores(
        model, tokenizer, texts[:3] + other_texts[:2], batch_size=3, prompts=prompts[:3] + other_prompts[:2],
        scored=scored,
    )  # fmt: skip
    assert len(rows) == 2
    assert_same_scores(mixed, {a: old[a][:3] + old_others[a][:2] for a in old})
    without_moments = score_qa_records(model, tokenizer, members, batch_size=4, reads=attack_reads(["min_k"]))
    assert without_moments[0].token_mean is None
    rows.clear()
    membership_scores(model, tokenizer, texts, prompts=prompts, attacks=["min_k"], scored=without_moments)
    assert rows == []
    membership_scores(model, tokenizer, texts, prompts=prompts, scored=without_moments)
    assert len(rows) == len(texts)


def chat_tokenizer(writes_bos: bool):
    """The embedded tokenizer (it adds a BOS) with a chat template that writes its own BOS (as Llama-3's) or none."""
    chat = build_tokenizer(generate_benchmark(num_authors=8), vocab_size=512)
    bos = "<s>" if writes_bos else ""
    chat.chat_template = (
        f"{{% for m in messages %}}{bos}{{{{ m['role'] }}}}: {{{{ m['content'] }}}}</s>{{% endfor %}}"
        f"{{% if add_generation_prompt %}}{bos}assistant:{{% endif %}}"
    )
    return chat


def test_a_chat_template_that_writes_its_own_bos_is_scored_with_one(records):
    """The attack encodes such a prompt without the tokenizer's special tokens, as tokenize_qa does: one BOS, the
    tokens the model was trained on, so the scores are read from the pass and equal the attack's own forward."""
    chat = chat_tokenizer(writes_bos=True)
    model = tiny_model(chat, "llama", seed=12, **SMALL)
    rows = records[:5]
    texts, prompts = attack_texts(chat, rows)
    scored = score_qa_records(model, chat, rows, reads=attack_reads(FORWARD_ATTACKS))
    assert all(s.input_ids[:2] == (chat.bos_token_id, s.input_ids[1]) != (chat.bos_token_id,) * 2 for s in scored)
    assert [s.input_ids for s in scored] == attack_sequences(chat, rows)  # the same tokens (the template's EOS)
    forwards = forwarded_rows(model)
    new = membership_scores(model, chat, texts, prompts=prompts, scored=scored)
    assert forwards == []  # read from the pass
    assert_same_scores(new, membership_scores(model, chat, texts, prompts=prompts))


def test_texts_whose_tokens_differ_from_the_pass_get_their_own_forward(records):
    """A chat template that writes no BOS for a tokenizer that adds one: the attack encodes the prompt with the
    tokenizer's special tokens (a BOS), the pass without them, so the attack's logits saw another prefix; it is not
    read from the pass."""
    chat = chat_tokenizer(writes_bos=False)
    model = tiny_model(chat, "llama", seed=12, **SMALL)
    rows = records[:5]
    texts, prompts = attack_texts(chat, rows)
    scored = score_qa_records(model, chat, rows, reads=attack_reads(FORWARD_ATTACKS))
    assert scored[0].input_ids[0] != chat.bos_token_id == attack_sequences(chat, rows)[0][0]
    forwards = forwarded_rows(model)
    new = membership_scores(model, chat, texts, prompts=prompts, scored=scored)
    assert sorted(forwards) == sorted(attack_sequences(chat, rows))
    assert_same_scores(new, membership_scores(model, chat, texts, prompts=prompts))


def test_hf_unlearn_eval_scores_the_forget_answers_once_for_the_attacks(tokenizer, records):
    """``hf-unlearn eval`` with forget, retain and holdout files: the forget answers' membership scores come from
    the scoring pass (no forward over the attack's forget sequences), with the values of the attacks' own passes."""
    from conftest import train_on_answers

    model = tiny_model(tokenizer, "qwen2", seed=13, **SMALL)
    train_on_answers(model, tokenizer, records[:6], steps=40, lr=1e-2)
    forget, retain, holdout = records[:6], records[6:10], records[10:16]
    sets = qa_evaluation_sets(tokenizer, forget, retain, holdout)
    rows = forwarded_rows(model)
    result = evaluate_benchmark(model, tokenizer, "your data", sets=sets)
    assert set(attack_sequences(tokenizer, forget)).isdisjoint(rows)  # the forget answers: read from the scoring pass
    assert set(attack_sequences(tokenizer, holdout)) <= set(rows)  # the never-seen answers: their own forward
    assert "forget_scores" not in result  # nothing that is not a metric is written
    old = {
        name: membership_scores(model, tokenizer, *attack_texts(tokenizer, data)[:1], prompts=attack_texts(
            tokenizer, data)[1], attacks=[a for a in ATTACKS if a != "reference"])
        for name, data in (("forget", forget), ("holdout", holdout))
    }  # fmt: skip
    auc = {attack: membership_auc(old["forget"][attack], old["holdout"][attack]) for attack in old["forget"]}
    assert result["muse"]["auc"] == pytest.approx(auc, abs=1e-12)


def test_compare_measurement_scores_the_forget_answers_once_for_min_k(tokenizer, records):
    from conftest import train_on_answers

    model = tiny_model(tokenizer, "gpt2", seed=14, **SMALL)
    train_on_answers(model, tokenizer, records[:6], steps=40, lr=1e-2)
    forget, retain, holdout = records[:6], records[6:10], records[10:16]
    rows = forwarded_rows(model)
    measured = measure_qa_sets(
        model, tokenizer, {"forget": forget, "retain": retain}, forget_set="forget", membership_holdout=holdout
    )
    # the forget answers read the scoring pass, the never-seen answers a pass of their own of the same kind
    assert set(attack_sequences(tokenizer, forget)).isdisjoint(rows)
    assert set(attack_sequences(tokenizer, holdout)).isdisjoint(rows)
    # ... with the values of Min-K%'s own forward over both sets
    own = {
        name: membership_scores(model, tokenizer, *attack_texts(tokenizer, data)[:1], prompts=attack_texts(
            tokenizer, data)[1], attacks=["min_k"])["min_k"]
        for name, data in (("forget", forget), ("holdout", holdout))
    }  # fmt: skip
    assert measured["forget"]["membership_auc"] == pytest.approx(membership_auc(own["forget"], own["holdout"]))
    # without membership, no shared pass: the forget answers' probability from evaluate_qa's own
    old = measure_qa_sets(model, tokenizer, {"forget": forget, "retain": retain}, forget_set="forget")
    assert measured["forget"]["membership_auc"] == qa_membership_auc(model, tokenizer, forget, holdout)
    assert measured["forget"]["membership_aucs"] == {"min_k": measured["forget"]["membership_auc"]}
    read = ("membership_auc", "membership_aucs", "membership_auc_intervals", "membership_scores")
    without = {k: v for k, v in measured["forget"].items() if k not in read}
    assert without == old["forget"]
    # the scores the AUC was read from, and its interval
    scores = measured["forget"]["membership_scores"]
    assert scores["forget"]["min_k"] == pytest.approx(own["forget"], abs=1e-5) and scores["holdout"][
        "min_k"
    ] == pytest.approx(own["holdout"], abs=1e-5)
    low, high = measured["forget"]["membership_auc_intervals"]["min_k"]
    assert low <= measured["forget"]["membership_auc"] <= high
    assert measured["retain"] == old["retain"]
    # every attack (compare's region, issue 54): each AUC is the one its own scoring of both sets gives
    every = measure_qa_sets(
        model, tokenizer, {"forget": forget}, forget_set="forget", membership_holdout=holdout,
        membership_attacks=ATTACKS, attack_reference_model=tiny_model(tokenizer, "gpt2", seed=3, **SMALL),
    )["forget"]["membership_aucs"]  # fmt: skip
    assert set(every) == set(ATTACKS)
    reference = tiny_model(tokenizer, "gpt2", seed=3, **SMALL)
    for attack in ATTACKS:
        scores = {
            name: membership_scores(model, tokenizer, attack_texts(tokenizer, data)[0], prompts=attack_texts(
                tokenizer, data)[1], attacks=[attack], reference_model=reference)[attack]
            for name, data in (("forget", forget), ("holdout", holdout))
        }  # fmt: skip
        assert every[attack] == pytest.approx(membership_auc(scores["forget"], scores["holdout"])), attack


def test_membership_verdict_judges_every_attack_against_the_never_trained_model_by_hand():
    from hf_unlearn.evaluation.membership import membership_verdict, membership_verdict_line

    never = {"loss": 0.37, "min_k": 0.43, "min_k_plus_plus": 0.47, "gradnorm": 0.41}
    measured = {"loss": 0.32, "min_k": 0.4275, "min_k_plus_plus": 0.1625, "gradnorm": 0.52, "zlib": 0.65}
    verdict = membership_verdict(measured, never)
    assert verdict["attacks"] == 5 and verdict["which"] == ["min_k_plus_plus", "gradnorm", "zlib"]
    assert verdict["distinguishing"] == 3 and not verdict["landed"]
    rows = verdict["per_attack"]
    assert rows["min_k_plus_plus"]["side"] == "member" and rows["min_k_plus_plus"]["off"] == pytest.approx(-0.3075)
    assert rows["gradnorm"]["side"] == "less familiar"  # 0.11 above the never-trained model's 0.41
    # zlib has no never-trained AUC: it is judged against chance (0.5), and 0.65 is 0.15 from it
    assert rows["zlib"]["level_from"] == "chance" and rows["zlib"]["level"] == 0.5
    assert rows["loss"]["distinguishes"] is False and rows["loss"]["side"] is None
    assert "3 of 5 attacks tell" in membership_verdict_line(verdict) and "min_k_plus_plus (AUC 0.163 vs 0.470" in (
        membership_verdict_line(verdict)
    )
    assert membership_verdict({"min_k": float("nan")}, never)["which"] == ["min_k"]  # NaN: never a pass
    landed = membership_verdict({"min_k": 0.5, "loss": 0.45})
    assert landed["landed"] and "none of the 2 attacks" in membership_verdict_line(landed)
    assert not membership_verdict({})["landed"]  # nothing read, nothing landed


def test_auc_intervals_cover_the_true_auc_and_the_paired_difference_is_read_finer():
    """DeLong's interval of one AUC covers the true AUC of the scores' distributions about 95 % of the time at the
    demo's size (20 answers a side, half-width ~0.17); the paired interval of two models' difference on the same
    answers covers the true difference as often and is narrower than treating the two as independent."""
    import numpy as np
    from scipy.stats import norm

    from hf_unlearn.scores import membership_auc_interval, paired_auc_difference

    rng = np.random.default_rng(0)
    shift_a, shift_b, noise = 0.5, 0.3, 0.5
    # scores: a shared per-answer difficulty plus each model's own noise; AUC of N(s, 1 + noise^2) against N(0, ...)
    true_a, true_b = (norm.cdf(shift / np.sqrt(2 * (1 + noise**2))) for shift in (shift_a, shift_b))
    covered, covered_difference, paired_widths, independent_widths = 0, 0, [], []
    trials = 400
    for _ in range(trials):
        forget, holdout = rng.normal(0, 1, 20), rng.normal(0, 1, 20)
        a = (forget + rng.normal(0, noise, 20), holdout + shift_a + rng.normal(0, noise, 20))
        b = (forget + rng.normal(0, noise, 20), holdout + shift_b + rng.normal(0, noise, 20))
        low, high = membership_auc_interval(a[0].tolist(), a[1].tolist())
        covered += low <= true_a <= high
        difference, low, high = paired_auc_difference(a[0].tolist(), a[1].tolist(), b[0].tolist(), b[1].tolist())
        covered_difference += low <= true_a - true_b <= high
        paired_widths.append(high - low)
        independent = [membership_auc_interval(m[0].tolist(), m[1].tolist()) for m in (a, b)]
        independent_widths.append(2 * np.hypot(*[(h - lo) / 2 for lo, h in independent]))
    assert 0.91 <= covered / trials <= 0.98
    assert 0.91 <= covered_difference / trials <= 0.99
    assert np.mean(paired_widths) < 0.8 * np.mean(independent_widths)
    assert 0.15 < np.mean(independent_widths) / 2 / np.sqrt(2) < 0.2  # one AUC of 20 against 20: about ±0.17
    assert all(np.isnan(v) for v in membership_auc_interval([0.1], [0.2, 0.3]))
    with pytest.raises(ValueError, match="same answers"):
        paired_auc_difference([0.1, 0.2], [0.3, 0.4], [0.1], [0.3, 0.4])


def test_intervals_resample_authors_where_answers_share_one():
    """Issue 66: answers about one author share its name and its familiarity, so they are not independent draws. With
    an author effect as large as the answers' own spread (25 authors of 10 answers a side, the judge size), DeLong over
    answers covers the true AUC about half the time; grouped by author (Obuchowski 1997) it covers it about 95 % of the
    time, and the paired difference resamples the same authors. One answer per group is DeLong's interval exactly."""
    import numpy as np
    from scipy.stats import norm, t

    from hf_unlearn.evaluation.membership import membership_reads, paired_off_interval
    from hf_unlearn.scores import groups_of, membership_auc_interval, paired_auc_difference

    rng = np.random.default_rng(0)
    forget, holdout = rng.normal(0, 1, 30).tolist(), rng.normal(0.3, 1, 40).tolist()
    singletons = membership_auc_interval(forget, holdout, forget_groups=range(30), holdout_groups=range(40))
    plain = membership_auc_interval(forget, holdout)
    # DeLong's variance exactly; the quantile is Student's t with 29 degrees (the smaller side's groups - 1)
    assert np.diff(singletons)[0] / np.diff(plain)[0] == pytest.approx(t.ppf(0.975, 29) / norm.ppf(0.975))
    assert np.mean(singletons) == pytest.approx(np.mean(plain))
    authors = np.repeat(np.arange(25), 10)
    covered = {"answers": 0, "authors": 0}
    covered_difference = 0
    trials = 300
    for _ in range(trials):
        # both models read each author alike (its name), each answer with its own noise; true AUC 0.5, difference 0
        sides = [rng.normal(0, 1, 25)[authors] + rng.normal(0, 1, 250) for _ in range(2)]
        low, high = membership_auc_interval(*sides)
        covered["answers"] += low <= 0.5 <= high
        low, high = membership_auc_interval(*sides, forget_groups=authors, holdout_groups=authors)
        covered["authors"] += low <= 0.5 <= high
        other = [side + rng.normal(0, 0.5, 250) for side in sides]
        _, low, high = paired_auc_difference(*sides, *other, forget_groups=authors, holdout_groups=authors)
        covered_difference += low <= 0 <= high
    assert covered["answers"] / trials < 0.75
    assert 0.91 <= covered["authors"] / trials <= 0.98
    assert 0.91 <= covered_difference / trials <= 0.99
    # 4 authors of 5 answers a side (the quick demo): the t quantile covers where the normal one fell to 87 %
    few = np.repeat(np.arange(4), 5)
    covered_few = 0
    for _ in range(trials):
        sides_few = [rng.normal(0, 1, 4)[few] + rng.normal(0, 1, 20) for _ in range(2)]
        low, high = membership_auc_interval(*sides_few, forget_groups=few, holdout_groups=few)
        covered_few += low <= 0.5 <= high
    assert covered_few / trials >= 0.91
    one_author = membership_auc_interval(forget, holdout, forget_groups=[0] * 30, holdout_groups=range(40))
    assert all(np.isnan(v) for v in one_author)
    # groups on one side only would mix two kinds of draw: both sides are then read as answers
    assert membership_auc_interval(forget, holdout, forget_groups=[0] * 30) == plain
    with pytest.raises(ValueError, match="one group per answer"):
        membership_auc_interval(forget, holdout, forget_groups=[0, 1], holdout_groups=range(40))
    # records that name their author carry their groups into the scores, and the paired interval reads them
    records = [{"question": "q", "answer": "a", "author": f"A{i // 10}"} for i in range(250)]
    assert groups_of(records) == [r["author"] for r in records]
    assert groups_of([{"question": "q", "answer": "a"}]) is None
    scores = {"loss": sides[0].tolist()}, {"loss": sides[1].tolist()}
    grouped = membership_reads(*scores, groups_of(records), groups_of(records))
    plain = membership_reads(*scores)
    # a reference that reads the authors its own way (the unlearned model still knows the forget authors' names)
    other = [rng.normal(0, 1, 25)[authors] + rng.normal(0, 1, 250) for _ in range(2)]
    reference = membership_reads({"loss": other[0].tolist()}, {"loss": other[1].tolist()})
    assert grouped["scores"]["groups"]["forget"] == groups_of(records) and "groups" not in plain["scores"]
    widths = [np.diff(paired_off_interval(r["scores"], reference["scores"], "loss"))[0] for r in (grouped, plain)]
    assert widths[0] > 1.5 * widths[1]


def test_the_verdict_says_too_few_answers_where_the_interval_cannot_judge_the_tolerance():
    """An attack whose difference to the never-trained model has a 95 % interval wider than ±0.1 is neither 'lands'
    nor 'tells': 'too few answers to judge', and the run has not landed; within ±0.1 the point decides, and the
    verdict is 'certain' where the whole interval is on one side of the tolerance."""
    from hf_unlearn.evaluation.membership import membership_verdict, membership_verdict_line

    never = {"loss": 0.40, "min_k": 0.40, "zlib": 0.40}
    measured = {"loss": 0.42, "min_k": 0.20, "zlib": 0.45}
    intervals = {"loss": (-0.02, 0.06), "min_k": (-0.26, -0.14), "zlib": (-0.12, 0.22)}
    verdict = membership_verdict(measured, never, off_intervals=intervals)
    rows = verdict["per_attack"]
    assert rows["loss"]["verdict"] == "lands" and rows["loss"]["certain"]
    assert rows["min_k"]["verdict"] == "tells" and rows["min_k"]["certain"] and rows["min_k"]["side"] == "member"
    assert rows["zlib"]["verdict"] == "too few answers to judge" and not rows["zlib"]["distinguishes"]
    assert verdict["too_few"] == ["zlib"] and verdict["which"] == ["min_k"] and not verdict["landed"]
    line = membership_verdict_line(verdict)
    assert "Too few answers to judge 1 of 3 (zlib)" in line and "±0.17" in line and "[-0.260, -0.140]" in line
    near = membership_verdict({"loss": 0.49}, never, off_intervals={"loss": (0.02, 0.16)})["per_attack"]["loss"]
    assert near["verdict"] == "lands" and not near["certain"]  # 0.09 off: lands, but the interval reaches past 0.1
    alone = membership_verdict({"loss": 0.42}, never, off_intervals={"loss": (-0.02, 0.06)})
    assert alone["landed"] and "none of the 1 attacks" in membership_verdict_line(alone)
    # wide, but wholly past the tolerance: it tells however few the answers (the demo's Min-K%++, -0.33 [-0.50, -0.15])
    wide = membership_verdict({"mkpp": 0.07}, {"mkpp": 0.40}, off_intervals={"mkpp": (-0.50, -0.15)})
    row = wide["per_attack"]["mkpp"]
    assert row["verdict"] == "tells" and row["certain"] and row["side"] == "member" and wide["too_few"] == []
    unjudged = membership_verdict({"loss": 0.42}, never, off_intervals={"loss": (float("nan"), float("nan"))})
    assert unjudged["too_few"] == ["loss"] and not unjudged["landed"]  # no interval (one answer): not judged


def test_a_perfect_separation_reads_no_interval_and_cannot_land():
    """Scores that separate the forget answers from the never-seen ones perfectly for both models (the reference
    attack against the start model on the demo: AUC 1.0 for the unlearned and the never-trained model alike) give
    DeLong's paired variance 0. That is no certainty 20 answers a side can give, so the difference gets no interval,
    and the attack is 'too few answers to judge' instead of 'lands' for certain. Where only one model separates them
    the other's spread still gives an interval; two models with the same, overlapping scores read exactly 0."""
    from hf_unlearn.evaluation.membership import membership_verdict, membership_verdict_line
    from hf_unlearn.scores import membership_auc_interval, paired_auc_difference

    forget, holdout = [5.0 + 0.1 * i for i in range(20)], [0.1 * i for i in range(20)]
    never_forget, never_holdout = [4.0 + 0.1 * i for i in range(20)], [0.2 * i for i in range(20)]
    difference, low, high = paired_auc_difference(forget, holdout, never_forget, never_holdout)
    assert difference == 0.0 and math.isnan(low) and math.isnan(high)
    verdict = membership_verdict({"reference": 1.0}, {"reference": 1.0}, off_intervals={"reference": (low, high)})
    assert verdict["per_attack"]["reference"]["verdict"] == "too few answers to judge" and not verdict["landed"]
    assert "no interval could be read" in membership_verdict_line(verdict)
    # separated the opposite ways (AUC 1 against 0): a difference of 1 that tells, as before
    difference, low, high = paired_auc_difference(forget, holdout, never_holdout, never_forget)
    assert abs(difference) == 1.0 and low == high == difference
    opposite = membership_verdict({"reference": 1.0}, {"reference": 0.0}, off_intervals={"reference": (low, high)})
    assert opposite["per_attack"]["reference"]["verdict"] == "tells"
    # all tied for both: the same
    assert math.isnan(paired_auc_difference([1.0] * 5, [1.0] * 5, [2.0] * 5, [2.0] * 5)[1])
    # one model separates the sets, the other does not: its spread gives the difference an interval
    overlapping = [0.3 * i for i in range(20)]
    low, high = membership_auc_interval(overlapping, holdout)
    assert 0.0 <= low < high <= 1.0
    difference, low, high = paired_auc_difference(forget, holdout, overlapping, holdout)
    assert low < difference < high and high - low > 0.05
    # a model read against itself differs by exactly 0
    assert paired_auc_difference(overlapping, holdout, overlapping, holdout) == (0.0, 0.0, 0.0)
