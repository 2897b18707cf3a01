"""The audit: one verdict per check with its threshold, a FAILED relearning verdict on a model whose forgetting is
only suppressed, the membership verdict from MUSE's PrivLeak, and a Robustness section in the card."""

import json

import pytest
from conftest import quantized_and_kept

from hf_unlearn.outputs.model_card import build_model_card
from hf_unlearn.robustness.audit import (
    audit_markdown,
    membership_check,
    quantization_verdict,
    run_audit,
)
from hf_unlearn.training.record import UnlearnRecord


@pytest.fixture(scope="module")
def setting(suppressed_setting):
    s = suppressed_setting
    return tuple(s[k] for k in ("tokenizer", "forget", "retain", "holdout", "target", "suppressed", "reference"))


def test_membership_verdicts_follow_museS_privleak(setting):
    tokenizer, forget, _, holdout, target, _, reference = setting
    remembered = membership_check(target, tokenizer, forget, holdout, reference_model=reference)
    assert remembered["auc"]["min_k"] < 0.2 and remembered["privleak"]["min_k"] < -20
    assert remembered["verdict"] == "under-unlearned"
    itself = membership_check(reference, tokenizer, forget, holdout, reference_model=reference)
    assert itself["privleak"]["min_k"] == 0.0 and itself["verdict"] == "like retraining"
    assert membership_check(target, tokenizer, forget, holdout)["verdict"] == "no reference"


def test_audit_fails_a_suppressed_model_and_says_why(setting):
    tokenizer, forget, retain, holdout, target, suppressed, reference = setting
    # 20 steps: after 10 the excess over the reference was +0.152 with AVX2 kernels, +0.055 with AVX-512 ones
    audit = run_audit(
        suppressed, tokenizer, forget, retain, holdout, reference_model=reference, target_model=target,
        relearn_steps=20, relearn_learning_rate=1e-3,
    )  # fmt: skip
    verdicts = audit["verdicts"]
    assert set(verdicts) == {"quantization", "relearning", "membership"}
    assert verdicts["relearning"]["passed"] is False and "ROUGE-L" in verdicts["relearning"]["threshold"]
    # GPT-2 of width 64, 2 blocks x (attn.c_attn 192 x 64, attn.c_proj 64 x 64, mlp.c_fc 256 x 64, mlp.c_proj
    # 64 x 256): shapes bitsandbytes' AVX-512 BF16 kernel packs, so all 8 are in 4 bits on any CPU (lm_head stays in
    # full precision), and the verdict is a real one.
    nf4 = audit["quantization"]["nf4"]
    assert quantized_and_kept(nf4) == (8, 0) and nf4["linear_layers"] == 8 and nf4["measured"] is True
    assert isinstance(verdicts["quantization"]["passed"], bool)
    markdown = audit_markdown(audit)
    assert "| relearning | FAILED |" in markdown and "### Membership attacks" in markdown
    record = UnlearnRecord(
        method="ga",
        forget_objective="ga",
        retain_objective="none",
        audit={"verdicts": verdicts, "membership": audit["membership"]},
    )
    record.update(quantization=audit["quantization"], relearning=audit["relearning"])
    card = str(build_model_card(record, "out"))
    assert "## Robustness" in card and "| relearning | **failed** |" in card and "## Relearning check" in card
    # the unlearning block, as a machine reads it back (issue 67): every attack with its interval and verdict
    from huggingface_hub import ModelCard

    block = ModelCard(card).data.to_dict()["unlearning"]
    assert (
        block["relearning"]["passed"] is False
        and block["quantization"]["passed"] is verdicts["quantization"]["passed"]
    )
    membership = block["membership"]
    assert membership["judged_by"] == "audit" and membership["landed"] is audit["membership"]["attacks"]["landed"]
    rows = {row["attack"]: row for row in membership["attacks"]}
    for attack, row in audit["membership"]["attacks"]["per_attack"].items():
        assert rows[attack]["auc"] == pytest.approx(row["auc"]) and rows[attack]["verdict"] == row["verdict"]
        assert rows[attack]["auc_interval"] == pytest.approx(audit["membership"]["auc_interval"][attack])
        assert rows[attack]["never_trained_auc"] == pytest.approx(audit["membership"]["reference_auc"][attack])
        assert rows[attack]["difference_interval"] == pytest.approx(row["off_interval"])
    json.dumps(audit)  # audit.json is plain JSON


def test_a_quantization_check_that_quantized_nothing_is_not_judged(setting):
    """Under the shape rule of bitsandbytes' AVX-512 BF16 kernel (given, so on any CPU), GPT-2 of width 48 keeps every
    layer in full precision: the verdict is "not judged" with the reason, in the audit and in the card, never
    "passed"; with 8 bits beside it (measured) it is still not judged, and a real return still fails."""
    from hf_unlearn.benchmarks import tiny_model
    from hf_unlearn.robustness.quantize import check_quantization_robustness

    tokenizer, forget, retain = setting[:3]
    model = tiny_model(tokenizer, "gpt2", hidden_size=48, num_layers=1, num_heads=2)
    result = check_quantization_robustness(model, tokenizer, forget, retain, modes=("nf4", "int8"), avx512_bf16=True)
    assert quantized_and_kept(result["nf4"]) == (0, 4) and result["int8"]["measured"] is True
    verdict = quantization_verdict(result, ("nf4", "int8"))
    assert verdict["passed"] is None
    assert verdict["finding"].startswith("nf4 not measured: only 0 of 4 linear layers were quantized")
    assert quantization_verdict(result, ("int8",))["passed"] is not None  # 8 bits alone: measured, judged
    record = UnlearnRecord(
        method="ga", forget_objective="ga", retain_objective="none", audit={"verdicts": {"quantization": verdict}}
    )
    record.update(quantization=result)
    card = str(build_model_card(record, "out"))
    assert "| quantization | not judged | nf4 not measured: only 0 of 4" in card
    assert "| quantization | passed |" not in card and "Not measured in nf4: only 0 of 4" in card
    # Knowledge that came back in a measured mode fails the check, whatever the other mode.
    result["int8"]["knowledge_returned"] = True
    assert quantization_verdict(result, ("nf4", "int8"))["passed"] is False
