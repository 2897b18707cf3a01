"""Model card, offline push, and the 4-bit / 8-bit robustness check on real bitsandbytes layers."""

import hashlib
import json
import math
import os

import pytest
import torch
from conftest import make_example, make_tiny_model
from peft import LoraConfig

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model
from hf_unlearn.cli import main
from hf_unlearn.quantize import check_quantization_robustness, quantization_table
from hf_unlearn.record import UnlearnRecord

FORGET = [make_example(i) for i in range(8)]
RETAIN = [make_example(1000 + i) for i in range(16)]


def trainer_for(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        probe_interval=2,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        learning_rate=3e-3,
        gradient_surgery="sago",
    )
    values.update(overrides)
    return UnlearnTrainer(make_tiny_model(), UnlearnConfig(**values), FORGET, RETAIN)


def folder_digest(path):
    digest = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                digest[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return digest


def test_model_card_records_the_unlearning(tmp_path):
    trainer = trainer_for(tmp_path)
    trainer.train()
    trainer.record.update(
        before={"forget": {"rouge_l_recall": 1.0, "probability": 0.9, "exact_match": 1.0}},
        after={"forget": {"rouge_l_recall": 0.2, "probability": 0.1, "exact_match": 0.0}},
        forget_dataset={"name": "locuslab/TOFU / forget10", "num_examples": 8},
        retain_dataset={"name": "locuslab/TOFU / retain90", "num_examples": 16},
    )
    trainer.save_model()
    card = (tmp_path / "out" / "README.md").read_text()
    for expected in (
        "- unlearning",
        "- hf_unlearn",
        "- masc",
        "library_name: transformers",
        "- locuslab/TOFU",  # datasets metadata
        "Fast Unlearning at Scale via Margin Self-Correction",
        "`sago`",
        "Asymmetric Two-Task",
        "forget `masc`, retain `kl`",
        "forget `locuslab/TOFU / forget10` (8 examples) while keeping `locuslab/TOFU / retain90`",
        "Exact-reproduction bound",
        "| forget | rouge_l_recall | 1 | 0.2 |",
        "`masc_k` | 10",
        "`masc_eta` | 0.5",
        "Last violation rate",
        "Why training stopped | ",
    ):
        assert expected in card, expected
    for placeholder in ("the forget set", "](#)", "None", "path/to/model"):
        assert placeholder not in card, placeholder
    assert (tmp_path / "out" / "model.safetensors").exists()
    saved = UnlearnRecord.load(str(tmp_path / "out"))
    assert saved.complete and saved.after["forget"]["rouge_l_recall"] == 0.2
    assert saved.stopped_early and saved.global_step == saved.stop_step == 2  # a random model violates nothing


def test_card_lists_each_objectives_own_hyperparameters(tmp_path):
    trainer = trainer_for(tmp_path, method="npo_klr", gradient_surgery="sum", npo_beta=0.25)
    trainer.train()
    trainer.save_model()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "`npo_beta` | 0.25" in card and "Negative Preference Optimization" in card
    assert "masc_k" not in card and "stop_alpha" not in card  # neither MASC's nor the (off) stopping rule's
    assert "a forget set of 8 examples while keeping a retain set of 16 examples" in card
    assert "a causal language model" in card  # nothing known about the base: no link, no placeholder


def test_checkpoint_saves_read_the_record_and_run_no_forward(tmp_path):
    trainer = trainer_for(tmp_path, save_strategy="steps", save_steps=2, probe_interval=0, stop_on_violation=False)
    forwards = []
    trainer.model.register_forward_hook(lambda *_: forwards.append(trainer.state.global_step))
    trainer.train()
    card = (tmp_path / "out" / "checkpoint-2" / "README.md").read_text()
    assert "Unlearning record" in card
    # Forward passes only for training (2 parts x 4 steps) and the final bound (trained forget examples, one batch).
    assert len(forwards) == 2 * 4 + 1
    partial = UnlearnRecord.load(str(tmp_path / "out" / "checkpoint-2"))
    assert not partial.complete and partial.exact_reproduction_bound is None and partial.global_step == 2


def test_adapter_card_keeps_peft_metadata(tmp_path, monkeypatch):
    model = make_tiny_model()
    model.config._name_or_path = "someone/tiny-base"
    lora = LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")
    args = UnlearnConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, probe_interval=0, stop_on_violation=False,
        report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = UnlearnTrainer(model, args, FORGET, RETAIN, peft_config=lora)
    trainer.train()
    trainer.save_model()
    card = (tmp_path / "out" / "README.md").read_text()
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
    assert "library_name: peft" in card and "base_model: someone/tiny-base" in card
    assert "[someone/tiny-base](https://huggingface.co/someone/tiny-base)" in card
    assert "LORA adapter" in card and "AutoPeftModelForCausalLM" in card and "- unlearning" in card
    assert "Unlearning record" in card


def test_checkpoints_carry_the_card(tmp_path):
    trainer = trainer_for(tmp_path, save_strategy="steps", save_steps=2)
    trainer.train()
    assert "Unlearning record" in (tmp_path / "out" / "checkpoint-2" / "README.md").read_text()


def test_push_without_network_fails_clearly_and_changes_nothing(tmp_path, monkeypatch):
    trainer = trainer_for(tmp_path)
    trainer.train()
    trainer.save_model()
    before = folder_digest(tmp_path / "out")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match="offline mode is on.*Nothing was written or uploaded"):
        trainer.push_to_hub()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # loopback port with nothing listening
    with pytest.raises(ConnectionError, match="127.0.0.1:9 is not reachable"):
        trainer.push_to_hub()
    assert folder_digest(tmp_path / "out") == before


@pytest.fixture(scope="module")
def saved_tiny_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=64, num_layers=2, num_heads=2)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root, model, tokenizer


def test_quantization_check_uses_real_bitsandbytes_layers(saved_tiny_model):
    root, model, tokenizer = saved_tiny_model
    forget, retain = load_split("forget01"), load_split("retain99").select(range(5))
    result = check_quantization_robustness(model, tokenizer, forget, retain)
    assert set(result) == {"full_precision", "nf4", "fp4", "int8"}
    for mode in ("nf4", "fp4", "int8"):
        assert result[mode]["quantized_layers"] == 2 * 7  # q, k, v, o, gate, up, down per layer
        for side in ("forget", "retain"):
            for value in result[mode][side].values():
                assert value == value and abs(value) != float("inf")  # finite, not NaN
        assert isinstance(result[mode]["knowledge_returned"], bool)
    assert "| forget | rouge_l_recall |" in quantization_table(result)


def test_quantization_check_merges_lora_first(saved_tiny_model):
    _, model, tokenizer = saved_tiny_model
    from peft import get_peft_model

    peft_model = get_peft_model(
        tiny_model(tokenizer, "llama", hidden_size=64, num_layers=2, num_heads=2),
        LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"),
    )
    result = check_quantization_robustness(peft_model, tokenizer, load_split("forget01"), modes=("nf4",))
    assert result["nf4"]["quantized_layers"] == 14
    assert any(isinstance(p, torch.Tensor) for p in peft_model.parameters())  # the caller's model is untouched


def test_quant_check_command(tmp_path, saved_tiny_model, capsys):
    root, _, _ = saved_tiny_model
    args = [
        "quant-check",
        "--model",
        str(root),
        "--split",
        "forget01",
        "--modes",
        "nf4",
        "--output_dir",
        str(tmp_path),
    ]
    # A model with no record of learning the embedded benchmark is not checked on it unless asked.
    assert main(args) == 1 and "--forget_data" in capsys.readouterr().err
    assert main(args + ["--benchmark", "embedded"]) == 0
    result = json.loads((tmp_path / "quant_check.json").read_text())
    assert result["nf4"]["quantized_layers"] == 14


def test_push_command_without_network_names_the_problem(tmp_path, monkeypatch, capsys):
    trainer = trainer_for(tmp_path)
    trainer.train()
    trainer.save_model()
    before = folder_digest(tmp_path / "out")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    push = ["push", "--model_dir", str(tmp_path / "out"), "--repo_id", "someone/unlearned", "--merge_adapter", "true"]
    assert main(push) == 1 and "offline mode is on" in capsys.readouterr().err
    assert main(["push", "--model_dir", str(tmp_path / "missing"), "--repo_id", "someone/unlearned"]) == 1
    assert "is not a folder" in capsys.readouterr().err
    monkeypatch.setenv("HF_UNLEARN_TRACEBACK", "1")
    with pytest.raises(ConnectionError, match="offline mode is on"):
        main(push)
    assert folder_digest(tmp_path / "out") == before


def test_qlora_trains_adapters_on_a_4bit_base_on_cpu(tmp_path, saved_tiny_model):
    root, _, tokenizer = saved_tiny_model
    from hf_unlearn.data import build_qa_dataset
    from hf_unlearn.jobs import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(root), load_in_4bit=True)
    assert sum(type(m).__name__ == "Linear4bit" for m in model.modules()) == 14
    forget = build_qa_dataset(load_split("forget01"), tokenizer)
    retain = build_qa_dataset(load_split("retain99").select(range(8)), tokenizer)
    # NPO+KLR: its forget gradient is non-zero on a random model (MASC's hinge is 0 there), and both of its terms
    # use the reference, which here is the 4-bit base with the adapters disabled.
    args = UnlearnConfig(
        output_dir=str(tmp_path),
        method="npo_klr",
        max_steps=3,
        probe_interval=1,
        stop_on_violation=False,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = UnlearnTrainer(model, args, forget, retain, processing_class=tokenizer, peft_config=lora)
    assert trainer.ref_model is None  # the reference is the 4-bit base with adapters disabled
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if n in before and not torch.equal(p, before[n])]
    assert changed and all("lora_" in n for n in changed)
    assert math.isfinite(trainer.record.probe_history[-1]["retain_probability"])  # a finite probe, 4-bit model
