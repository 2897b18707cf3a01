"""The audit: one verdict per check with its threshold, a FAILED relearning verdict on a model whose forgetting is
only suppressed, the membership verdict from MUSE's PrivLeak, and a Robustness section in the card."""

import json

import pytest

from hf_unlearn.outputs.model_card import build_model_card
from hf_unlearn.robustness.audit import PRIVLEAK_TOLERANCE, audit_markdown, membership_check, run_audit
from hf_unlearn.training.record import UnlearnRecord


@pytest.fixture(scope="module")
def setting(suppressed_setting):
    s = suppressed_setting
    return tuple(s[k] for k in ("tokenizer", "forget", "retain", "holdout", "target", "suppressed", "reference"))


def test_membership_verdicts_follow_museS_privleak(setting):
    tokenizer, forget, _, holdout, target, _, reference = setting
    remembered = membership_check(target, tokenizer, forget, holdout, reference_model=reference)
    assert remembered["auc"]["min_k"] < 0.2 and remembered["privleak"]["min_k"] < -PRIVLEAK_TOLERANCE
    assert remembered["verdict"] == "under-unlearned"
    itself = membership_check(reference, tokenizer, forget, holdout, reference_model=reference)
    assert itself["privleak"]["min_k"] == 0.0 and itself["verdict"] == "like retraining"
    assert membership_check(target, tokenizer, forget, holdout)["verdict"] == "no reference"


def test_audit_fails_a_suppressed_model_and_says_why(setting):
    tokenizer, forget, retain, holdout, target, suppressed, reference = setting
    audit = run_audit(
        suppressed, tokenizer, forget, retain, holdout, reference_model=reference, target_model=target,
        relearn_steps=10, relearn_learning_rate=1e-3,
    )  # fmt: skip
    verdicts = audit["verdicts"]
    assert set(verdicts) == {"quantization", "relearning", "membership"}
    assert verdicts["relearning"]["passed"] is False and "ROUGE-L" in verdicts["relearning"]["threshold"]
    assert isinstance(verdicts["quantization"]["passed"], bool)
    # GPT-2, 2 blocks x (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj); lm_head stays in full precision.
    assert audit["quantization"]["nf4"]["quantized_layers"] == 8
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
    json.dumps(audit)  # audit.json is plain JSON
