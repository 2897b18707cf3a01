"""UNDO after unlearning (Lee et al. 2025, arXiv 2506.06278): the noising against a hand computation, the forward KL
against its definition, the distillation bringing the noised student back to the teacher on the retain data, LoRA
merged into a copy, bad input refused before any weight changes, and `hf-unlearn distill` saving the student with
its record and card."""

import json
import math

import pytest
import torch
from conftest import make_example, make_tiny_model, memorize, save_model_folder, write_qa_files

from hf_unlearn.cli.main import main
from hf_unlearn.robustness.distill import (
    distill_into_perturbed,
    forward_kl,
    mean_kl_to_teacher,
    perturb_toward_noise,
)

RETAIN = [make_example(2000 + i) for i in range(16)]


class PadTokenizer:
    """What the distillation reads of a tokenizer for pre-tokenized examples: the pad id."""

    pad_token_id = 0
    eos_token_id = 0


@pytest.fixture(scope="module")
def teacher_state():
    model = memorize(make_tiny_model("llama"), RETAIN, steps=60, lr=1e-2)
    return {k: v.clone() for k, v in model.state_dict().items()}


def teacher_of(state):
    model = make_tiny_model("llama")
    model.load_state_dict(state)
    return model


def test_noising_is_the_papers_mixing_by_hand():
    """theta <- (1 - alpha) theta + alpha beta eps: eps uniform on +-sqrt(6 / (fan_in + fan_out)) for a matrix, drawn
    in parameter order from one CPU generator seeded with `seed`; vectors (norm weights) are only shrunk; frozen
    parameters stay."""
    alpha, beta, seed = 0.3, 0.1, 5
    model = make_tiny_model("llama")
    model.model.norm.weight.requires_grad_(False)
    before = [p.detach().clone() for p in model.parameters()]
    changed = perturb_toward_noise(model, alpha, beta, seed)
    generator = torch.Generator().manual_seed(seed)
    expected_changed = 0
    for old, new in zip(before, model.parameters()):
        if not new.requires_grad:
            assert torch.equal(new, old)
            continue
        expected_changed += old.numel()
        if old.dim() == 2:
            fan_out, fan_in = old.shape
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            eps = torch.empty(old.shape).uniform_(-bound, bound, generator=generator)
            torch.testing.assert_close(new, (1 - alpha) * old + alpha * beta * eps, rtol=0, atol=1e-7)
        else:
            torch.testing.assert_close(new, (1 - alpha) * old, rtol=0, atol=0)
    assert changed == expected_changed
    # alpha 0 keeps the weights; alpha 1 keeps nothing of them (the same seed gives the same noise).
    model, same = make_tiny_model("llama"), make_tiny_model("llama", seed=1)
    perturb_toward_noise(model, 0.0, beta, seed)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), make_tiny_model("llama").parameters()))
    perturb_toward_noise(model, 1.0, beta, seed)
    perturb_toward_noise(same, 1.0, beta, seed)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), same.parameters()))


def test_forward_kl_is_the_definition_over_unmasked_positions():
    generator = torch.Generator().manual_seed(0)
    teacher, student = torch.randn(2, 3, 5, generator=generator), torch.randn(2, 3, 5, generator=generator)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    p, q = teacher.softmax(-1), student.softmax(-1)
    per_position = (p * (p.log() - q.log())).sum(-1)
    expected = (per_position[0, 0] + per_position[0, 1] + per_position[1, 0]) / 3
    torch.testing.assert_close(forward_kl(teacher, student, mask), expected)
    assert forward_kl(teacher, teacher, mask).item() == pytest.approx(0.0, abs=1e-7)


def test_distillation_brings_the_noised_student_back_to_the_teacher(teacher_state):
    teacher = teacher_of(teacher_state)
    student, result = distill_into_perturbed(
        teacher, PadTokenizer(), RETAIN, alpha=0.5, steps=40, learning_rate=1e-2, batch_size=8, use_cpu=True
    )
    assert all(torch.equal(v, teacher_state[k]) for k, v in teacher.state_dict().items())  # the teacher stays
    assert result["kl_perturbed"] > 0.1  # the noising moved the student away
    assert result["kl_distilled"] < 0.3 * result["kl_perturbed"]
    # The reported KL is the student's on the retain data, measured again independently.
    again = mean_kl_to_teacher(student, teacher_of(teacher_state), RETAIN, pad_token_id=0)
    assert again == pytest.approx(result["kl_distilled"], rel=1e-5)
    assert result["retain_examples"] == len(RETAIN) and result["alpha"] == 0.5 and result["steps"] == 40
    assert any(not torch.equal(p, q) for p, q in zip(student.parameters(), teacher.parameters()))


def test_lora_teacher_is_merged_into_a_copy(teacher_state):
    from hf_unlearn.training.adapters import lora_config, with_adapter

    model = with_adapter(teacher_of(teacher_state), lora_config(4, "all-linear", dropout=0.0))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)  # adapters that change the outputs
    adapters = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    student, result = distill_into_perturbed(model, PadTokenizer(), RETAIN, alpha=0.0, steps=1, learning_rate=1e-9,
                                             use_cpu=True)  # fmt: skip
    assert not hasattr(student, "peft_config") and not any("lora_" in k for k in student.state_dict())
    # alpha 0 and a vanishing step: the student is the merged teacher, computing what the adapted model computes.
    assert result["kl_perturbed"] == pytest.approx(0.0, abs=1e-6)
    batch = torch.tensor([RETAIN[0]["input_ids"]])
    with torch.no_grad():
        adapted, base = model(input_ids=batch).logits, teacher_of(teacher_state)(input_ids=batch).logits
        torch.testing.assert_close(student(input_ids=batch).logits, adapted, rtol=0, atol=1e-5)
    assert (adapted - base).abs().max() > 1e-3  # (the adapters do change the outputs)
    assert {k: v for k, v in model.state_dict().items() if "lora_" in k}.keys() == adapters.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in adapters.items())  # the caller's adapters stay


@pytest.mark.parametrize(
    ("settings", "named"),
    [({"alpha": 1.5}, "alpha"), ({"alpha": -0.1}, "alpha"), ({"alpha": float("nan")}, "alpha"),
     ({"beta": -1.0}, "beta"), ({"steps": 0}, "steps"), ({"retain": []}, "retain"), ({"retain": None}, "retain")],
)  # fmt: skip
def test_bad_input_is_refused_by_name_before_any_weight_changes(teacher_state, settings, named):
    teacher = teacher_of(teacher_state)
    retain = settings.pop("retain", RETAIN)
    with pytest.raises(ValueError, match=named):
        distill_into_perturbed(teacher, PadTokenizer(), retain, use_cpu=True, **settings)
    with pytest.raises(ValueError, match="alpha"):
        perturb_toward_noise(teacher, 2.0)
    assert all(torch.equal(v, teacher_state[k]) for k, v in teacher.state_dict().items())


def test_cli_distill_saves_the_student_with_its_record_and_card(tmp_path, capsys):
    from hf_unlearn.benchmarks import build_tokenizer, tiny_model
    from hf_unlearn.training.record import UnlearnRecord

    tokenizer = build_tokenizer()
    unlearned = save_model_folder(tmp_path / "unlearned", tiny_model(tokenizer, "llama", hidden_size=32), tokenizer)
    record = UnlearnRecord(method="masc", forget_objective="masc", retain_objective="kl",
                           relearning={"stale": True}, after={"forget": {"rouge_l_recall": 0.5}})  # fmt: skip
    record.save(unlearned)  # (a relearning result of the unlearned model, which the student's record must drop)
    write_qa_files(tmp_path)
    common = ["distill", "--model_name_or_path", str(unlearned), "--retain_data", str(tmp_path / "retain.jsonl")]
    # Refused before anything is loaded or written: alpha outside [0, 1], the teacher's own folder, no retain data.
    assert main([*common, "--alpha", "2", "--output_dir", str(tmp_path / "a")]) == 1
    assert "alpha" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert main([*common, "--output_dir", str(unlearned)]) == 1
    assert "new folder" in capsys.readouterr().err
    assert main(common[:3] + ["--output_dir", str(tmp_path / "b")]) == 1
    assert "--retain_data" in capsys.readouterr().err and not (tmp_path / "b").exists()
    out = tmp_path / "distilled"
    status = main([*common, "--forget_data", str(tmp_path / "forget.json"), "--alpha", "0.3", "--steps", "3",
                   "--batch_size", "4", "--output_dir", str(out)])  # fmt: skip
    assert status == 0
    result = json.loads((out / "distill.json").read_text())
    assert result["alpha"] == 0.3 and result["steps"] == 3 and result["retain_examples"] == 20
    assert set(result["student"]) == {"forget", "retain"} and set(result["teacher"]) == {"forget", "retain"}
    saved = UnlearnRecord.load(out)
    assert saved.distillation["alpha"] == 0.3 and saved.relearning is None  # the teacher's check no longer holds
    assert saved.after["retain"]["rouge_l_recall"] == result["student"]["retain"]["rouge_l_recall"]
    assert any("Distillation Robustifies Unlearning" == paper["title"] for paper in saved.papers)
    card = (out / "README.md").read_text()
    assert "Distilled after unlearning (UNDO)" in card and "α = 0.3" in card
    assert UnlearnRecord.load(unlearned).distillation is None  # the teacher's folder is untouched
    assert "UNDO: alpha 0.3" in capsys.readouterr().out
    # A run of the embedded benchmark (its record names it): the retain split that goes with its forget split.
    record.update(extra={"benchmark": "fictitious_authors", "split": "forget05"}).save(unlearned)
    status = main(["distill", "--model_name_or_path", str(unlearned), "--steps", "1", "--evaluate", "false",
                   "--output_dir", str(tmp_path / "embedded")])  # fmt: skip
    assert status == 0
    assert json.loads((tmp_path / "embedded" / "distill.json").read_text())["retain_examples"] == 190
