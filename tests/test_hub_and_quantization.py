"""Model card, offline push, and the 4-bit / 8-bit robustness check on real bitsandbytes layers."""

import hashlib
import json
import math
import os

import pytest
import torch
from conftest import (
    forget_set,
    hand_answer_probability,
    make_tiny_model,
    quantized_and_kept,
    retain_set,
    save_model_folder,
    tiny_model_folder,
)
from peft import LoraConfig

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.benchmarks import load_split, tiny_model
from hf_unlearn.cli.main import main
from hf_unlearn.data.examples import tokenize_qa
from hf_unlearn.robustness.quantize import check_quantization_robustness, quantization_table
from hf_unlearn.training.record import UnlearnRecord

FORGET, RETAIN = forget_set(), retain_set()


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


def trained_and_saved(tmp_path, **overrides):
    """A short run saved to tmp_path/out, and the digest of that folder."""
    trainer = trainer_for(tmp_path, **overrides)
    trainer.train()
    trainer.save_model()
    return trainer, folder_digest(tmp_path / "out")


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
    # for machines (issue 67): the Hub's model-index and the unlearning block, read back by huggingface_hub
    from huggingface_hub import ModelCard

    from hf_unlearn.outputs.card_metadata import UNLEARNING_SCHEMA

    loaded = ModelCard.load(str(tmp_path / "out" / "README.md"))
    results = {(r.dataset_split, r.metric_type): r for r in loaded.data.eval_results}
    assert (
        results[("forget", "rouge_l_recall")].metric_value == 0.2
        and results[("forget", "exact_match")].metric_value == 0
    )
    assert results[("forget", "probability")].dataset_type == "locuslab/TOFU"
    assert loaded.data.model_name == "out" and "model-index" in card
    block = loaded.data.to_dict()["unlearning"]
    assert block["schema"] == UNLEARNING_SCHEMA and block["method"] == "masc" and block["base_model"] is None
    assert block["objectives"] == {"forget": "masc", "retain": "kl"}
    assert block["papers"][0]["title"].startswith("Fast Unlearning at Scale") and block["papers"][0]["url"]
    assert block["forget_set"] == {
        "name": "locuslab/TOFU / forget10", "num_examples": 8, "fingerprint": saved.forget_fingerprint
    }  # fmt: skip
    assert block["forget_set"]["fingerprint"].startswith("sha256:")
    assert block["stop"] == {"rule": saved.hyperparameters["stop_target"], "kind": "target", "step": 2,
                             "reason": saved.stop_reason}  # fmt: skip
    assert block["membership"] == {"judged_by": None, "landed": None, "tolerance": None, "attacks": []}
    assert (
        block["quantization"] is None and block["relearning"] is None and block["beyond_paper"] == saved.beyond_paper
    )


def test_card_lists_each_objectives_own_hyperparameters(tmp_path):
    trainer = trainer_for(tmp_path, method="npo_klr", gradient_surgery="sum", forget_loss_kwargs={"beta": 0.25})
    trainer.train()
    trainer.save_model()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| `forget_loss_kwargs` | {'beta': 0.25} |" in card and "Negative Preference Optimization" in card
    assert "masc_k" not in card and "stop_alpha" not in card  # neither MASC's nor the (off) stopping rule's
    assert "a forget set of 8 examples while keeping a retain set of 16 examples" in card
    assert "a causal language model" in card  # nothing known about the base: no link, no placeholder


def test_checkpoint_saves_read_the_record_and_run_no_forward(tmp_path):
    trainer = trainer_for(tmp_path, save_strategy="steps", save_steps=2, probe_interval=0, stop_at_target=False)
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
        output_dir=str(tmp_path / "out"), max_steps=2, probe_interval=0, stop_at_target=False,
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
    trainer, before = trained_and_saved(tmp_path, push_unverified=True)  # past the record's check, to the network
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match="offline mode is on.*Nothing was written or uploaded"):
        trainer.push_to_hub()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # loopback port with nothing listening
    with pytest.raises(ConnectionError, match="127.0.0.1:9 is not reachable"):
        trainer.push_to_hub()
    assert folder_digest(tmp_path / "out") == before


# Llama of width 64 (MLP 256): every linear layer a shape that bitsandbytes' AVX-512 BF16 CPU kernel packs
# (out features a multiple of 32, in features of 64), so its 4-bit path runs on that CPU too.
SIZES = dict(hidden_size=64, num_layers=2, num_heads=2)


@pytest.fixture(scope="module")
def saved_tiny_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    model, tokenizer = tiny_model_folder(root, "llama", **SIZES)
    return root, model, tokenizer


def bitsandbytes_config(mode):
    """Each mode as bitsandbytes documents it: 4-bit NF4 or FP4 (float32 compute), or LLM.int8()."""
    from transformers import BitsAndBytesConfig

    if mode == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=mode, bnb_4bit_compute_dtype=torch.float32)


def reload_quantized(path, mode):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, quantization_config=bitsandbytes_config(mode), device_map="cpu")


def mean_probability(model, tokenizer, records):
    """TOFU's answer probability, averaged over ``records``, by hand (one plain forward per record)."""
    examples = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in records]
    return sum(hand_answer_probability(model, e) for e in examples) / len(examples)


def test_quantization_check_uses_real_bitsandbytes_layers(saved_tiny_model):
    root, model, tokenizer = saved_tiny_model
    forget, retain = load_split("forget01"), load_split("retain99").select(range(5))
    result = check_quantization_robustness(model, tokenizer, forget, retain)
    assert set(result) == {"full_precision", "nf4", "fp4", "int8"}
    for mode in ("nf4", "fp4", "int8"):
        # q, k, v, o, gate, up, down per layer; shapes bitsandbytes' AVX-512 BF16 kernel packs (SIZES), so all are
        # quantized on any CPU and none kept in full precision.
        assert quantized_and_kept(result[mode]) == (2 * 7, 0) and result[mode]["linear_layers"] == 2 * 7
        for side in ("forget", "retain"):
            for value in result[mode][side].values():
                assert value == value and abs(value) != float("inf")  # finite, not NaN
        assert isinstance(result[mode]["knowledge_returned"], bool)
    assert "| forget | rouge_l_recall |" in quantization_table(result)
    # The numbers are the model's own in full precision, and in each mode those of the model reloaded through
    # bitsandbytes in that mode, scored by hand; each mode moves them (the weights really were quantized).
    sides = {"forget": forget, "retain": retain}
    full = {side: mean_probability(model, tokenizer, records) for side, records in sides.items()}
    for side in sides:
        assert result["full_precision"][side]["probability"] == pytest.approx(full[side], rel=1e-5)
    for mode in ("nf4", "fp4", "int8"):
        quantized = reload_quantized(root, mode)
        for side, records in sides.items():
            expected = mean_probability(quantized, tokenizer, records)
            assert expected != pytest.approx(full[side], rel=1e-5), (mode, side)
            assert result[mode][side]["probability"] == pytest.approx(expected, rel=1e-4), (mode, side)
            for metric in ("rouge_l_recall", "probability", "exact_match"):
                change = result[mode][side][metric] - result["full_precision"][side][metric]
                assert result[mode]["change"][side][metric] == pytest.approx(change, abs=1e-12)
        # Knowledge came back when a forget ROUGE-L or exact match rose by more than 0.05 (RETURN_THRESHOLD).
        rose = [result[mode]["change"]["forget"][k] > 0.05 for k in ("rouge_l_recall", "exact_match")]
        assert result[mode]["knowledge_returned"] is any(rose)
    nf4, fp4 = (result[m]["forget"]["probability"] for m in ("nf4", "fp4"))
    assert nf4 != pytest.approx(fp4, rel=1e-5)  # two 4-bit formats, two different grids


def test_quantization_check_merges_lora_first(saved_tiny_model, tmp_path):
    root, model, tokenizer = saved_tiny_model
    from peft import PeftModel, get_peft_model

    lora = LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")
    peft_model = get_peft_model(tiny_model(tokenizer, "llama", **SIZES), lora)
    # LoRA's B starts at zero, where merging changes nothing: give the adapter weights, as training would.
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.2)
    before = {name: value.clone() for name, value in peft_model.state_dict().items()}
    forget = load_split("forget01")
    result = check_quantization_robustness(peft_model, tokenizer, forget, modes=("nf4",))
    assert quantized_and_kept(result["nf4"]) == (14, 0)
    # The caller's model is untouched: still an adapter on its base, every weight as it was.
    assert isinstance(peft_model, PeftModel) and peft_model.state_dict().keys() == before.keys()
    assert all(torch.equal(value, before[name]) for name, value in peft_model.state_dict().items())
    # The merge by hand (LoRA, Hu et al. 2021: W + (alpha / r) B A) into a plain copy of the base, then NF4.
    merged = tiny_model(tokenizer, "llama", **SIZES)
    scaling = lora.lora_alpha / lora.r
    with torch.no_grad():
        for index, layer in enumerate(merged.model.layers):
            prefix = f"base_model.model.model.layers.{index}.self_attn.q_proj"
            a, b = before[f"{prefix}.lora_A.default.weight"], before[f"{prefix}.lora_B.default.weight"]
            layer.self_attn.q_proj.weight += scaling * b @ a
    save_model_folder(tmp_path / "merged", merged, tokenizer)
    assert result["full_precision"]["forget"]["probability"] == pytest.approx(
        mean_probability(merged, tokenizer, forget), rel=1e-5
    )
    expected = mean_probability(reload_quantized(tmp_path / "merged", "nf4"), tokenizer, forget)
    assert result["nf4"]["forget"]["probability"] == pytest.approx(expected, rel=1e-4)
    # The control: NF4 of the base without the adapter scores differently, so a check that dropped it would fail.
    assert mean_probability(reload_quantized(root, "nf4"), tokenizer, forget) != pytest.approx(expected, rel=1e-3)


def test_quant_check_command(tmp_path, saved_tiny_model, capsys):
    root, _, _ = saved_tiny_model
    args = [
        "quant-check",
        "--model_name_or_path",
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
    assert quantized_and_kept(result["nf4"]) == (14, 0) and result["nf4"]["measured"] is True


def test_push_command_without_network_names_the_problem(tmp_path, monkeypatch, capsys):
    trainer = trainer_for(tmp_path)
    trainer.train()
    trainer.save_model()
    before = folder_digest(tmp_path / "out")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    push = [
        "push",
        "--model_name_or_path",
        str(tmp_path / "out"),
        "--repo_id",
        "someone/unlearned",
        "--merge_adapter",
        "true",
        "--push_unverified",  # past the verdict check (test_push_refuses_a_run_its_record_does_not_call_forgotten)
        "true",
    ]
    assert main(push) == 1 and "offline mode is on" in capsys.readouterr().err
    assert main(["push", "--model_name_or_path", str(tmp_path / "missing"), "--repo_id", "someone/unlearned"]) == 1
    assert "is not a folder" in capsys.readouterr().err
    monkeypatch.setenv("HF_UNLEARN_TRACEBACK", "1")
    with pytest.raises(ConnectionError, match="offline mode is on"):
        main(push)
    assert folder_digest(tmp_path / "out") == before


def test_qlora_trains_adapters_on_a_4bit_base_on_cpu(tmp_path, saved_tiny_model):
    root, _, tokenizer = saved_tiny_model
    from hf_unlearn.data.examples import build_qa_dataset
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
        stop_at_target=False,
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


def test_push_refuses_an_adapter_whose_base_is_a_local_path(tmp_path, monkeypatch, capsys):
    """An adapter trained on a model loaded from a relative local folder names that folder by its absolute path, so
    `push` refuses it before any upload and leaves the folder as it was; --base_model_id names the Hub model instead
    (in the copy that is pushed), --merge_adapter pushes merged weights."""
    from transformers import AutoModelForCausalLM

    from hf_unlearn.outputs.hub import stage_adapter_on

    make_tiny_model().save_pretrained(tmp_path / "base")  # a local base (a model only: the trainer gets tokens)
    monkeypatch.chdir(tmp_path)
    lora = LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")
    args = UnlearnConfig(
        output_dir="out", max_steps=2, probe_interval=0, stop_at_target=False,
        report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = UnlearnTrainer(AutoModelForCausalLM.from_pretrained("base"), args, FORGET, RETAIN, peft_config=lora)
    trainer.train()
    trainer.save_model()
    base, out = str(tmp_path / "base"), str(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    before = folder_digest(out)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    push = ["push", "--model_name_or_path", out, "--repo_id", "someone/unlearned"]
    assert main(push) == 1
    error = capsys.readouterr().err
    assert f"the local path {base!r}" in error and "nobody else can load" in error
    assert "--merge_adapter true" in error and "--base_model_id ORG/NAME" in error
    assert folder_digest(out) == before
    # Either way out gets past the check (and then stops at the offline Hub, still changing nothing).
    for way_out in (["--merge_adapter", "true"], ["--base_model_id", "someone/tiny-base"]):
        assert main(push + way_out + ["--push_unverified", "true"]) == 1
        assert "offline mode is on" in capsys.readouterr().err
    assert main(push + ["--base_model_id", "./base"]) == 1 and "not a Hub model id" in capsys.readouterr().err
    assert folder_digest(out) == before
    # What --base_model_id uploads: a copy whose adapter config, record and card name the Hub model.
    stage_adapter_on(out, str(tmp_path / "staged"), "someone/tiny-base", "someone/unlearned")
    staged = tmp_path / "staged"
    assert json.loads((staged / "adapter_config.json").read_text())["base_model_name_or_path"] == "someone/tiny-base"
    record = UnlearnRecord.load(str(staged))
    digest = hashlib.sha256((tmp_path / "base" / "model.safetensors").read_bytes()).hexdigest()
    assert record.base_model == "someone/tiny-base" and record.base_model_weights == {"model.safetensors": digest}
    card = (staged / "README.md").read_text()
    assert "base_model: someone/tiny-base" in card and digest in card and base not in card
    assert folder_digest(out) == before


def test_push_refuses_a_run_its_record_does_not_call_forgotten(tmp_path, monkeypatch, capsys):
    """Issue 67: `push` refuses, before anything is written or uploaded, a run with no membership verdict, one whose
    verdict says the forget set still tells (or could not be judged), one whose 4-bit reload brought answers back,
    and a failed run; --push_unverified lets it through and the card then says what the record said. A public
    repository is created only when asked."""
    from huggingface_hub import ModelCard

    from hf_unlearn.cli.arguments import PushArguments
    from hf_unlearn.outputs.hub import card_for_repo, unverified_reasons
    from hf_unlearn.outputs.model_card import build_model_card

    assert PushArguments().private is True
    trainer = trainer_for(tmp_path)
    trainer.train()
    trainer.save_model()
    out = str(tmp_path / "out")
    before = folder_digest(out)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    push = ["push", "--model_name_or_path", out, "--repo_id", "someone/unlearned"]
    assert main(push) == 1
    error = capsys.readouterr().err
    assert "not pushed" in error and "no membership verdict" in error and "--push_unverified true" in error
    assert folder_digest(out) == before
    record = UnlearnRecord.load(out)

    def reasons(**fields):
        record.update(**fields).save(out)
        return unverified_reasons(out)

    from hf_unlearn.evaluation.membership import membership_verdict

    never, measured = {"loss": 0.40, "zlib": 0.40}, {"loss": 0.42, "zlib": 0.45}
    landed = membership_verdict(measured, never, off_intervals={"loss": (-0.02, 0.06), "zlib": (0.0, 0.1)})
    assert reasons(evaluation={"membership": {"membership": landed}}) == []
    too_few = membership_verdict(measured, never, off_intervals={"loss": (-0.2, 0.24), "zlib": (-0.12, 0.22)})
    assert "Too few answers to judge 2 of 2" in reasons(evaluation={"membership": {"membership": too_few}})[0]
    # the chronicles demo's verdict is its MUSE evaluation's after unlearning, which the card shows too
    assert reasons(evaluation={"muse": {"after": {"membership": landed}}}) == []
    assert "Too few answers" in reasons(evaluation={"muse": {"after": {"membership": too_few}}})[0]
    audit = {"verdicts": {
        "membership": {"passed": True, "finding": "alike", "threshold": ""},
        "quantization": {"passed": False, "finding": "NF4 brings 6 answers back", "threshold": ""},
    }}  # fmt: skip
    assert reasons(audit=audit) == ["the audit's quantization verdict: NF4 brings 6 answers back"]
    audit["verdicts"]["quantization"]["passed"] = True
    assert reasons(audit=audit) == []
    assert "the run failed" in reasons(stop_kind="utility_floor")[0]
    # pushed anyway: past the verdict (here stopped by the offline Hub), and the card says so
    assert main(push + ["--push_unverified", "true"]) == 1 and "offline mode is on" in capsys.readouterr().err
    record.update(extra={**record.extra, "pushed_unverified": ["no membership verdict"]})
    card = ModelCard(str(build_model_card(record, "someone/unlearned")))
    assert "Published although its own record does not say it forgot" in card.text
    # the card the push writes before uploading: marked when pushed despite, the mark cleared by a verified push
    # (the run audited in between), so that no earlier push's warning is left behind
    card_for_repo(out, "someone/unlearned", ["no membership verdict"])
    assert UnlearnRecord.load(out).extra["pushed_unverified"] == ["no membership verdict"]
    assert "Published although" in (tmp_path / "out" / "README.md").read_text()
    card_for_repo(out, "someone/unlearned", [])
    assert "pushed_unverified" not in UnlearnRecord.load(out).extra
    assert "Published although" not in (tmp_path / "out" / "README.md").read_text()


def test_trainer_push_reads_the_record_as_the_push_command_does(tmp_path, monkeypatch):
    """UnlearnTrainer.push_to_hub (and save_model with push_to_hub=True) refuses a run its record does not call
    forgotten before anything is written, goes on to the Hub once the record holds a landed verdict or with
    push_unverified; push_to_hub=True uploading checkpoints during the run is refused at configuration."""
    from hf_unlearn.evaluation.membership import membership_verdict

    trainer, before = trained_and_saved(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="not pushed.*no membership verdict.*push_unverified=True.*Nothing was"):
        trainer.push_to_hub()
    assert folder_digest(tmp_path / "out") == before and "pushed_unverified" not in trainer.record.extra
    never, measured = {"loss": 0.40}, {"loss": 0.42}
    landed = membership_verdict(measured, never, off_intervals={"loss": (-0.02, 0.06)})
    trainer.record.update(evaluation={"membership": {"auc": measured, "membership": landed}})
    with pytest.raises(ConnectionError, match="offline mode is on"):  # past the record: the Hub is next
        trainer.push_to_hub()
    trainer.record.update(stop_kind="utility_floor", stop_reason="retain fell")
    with pytest.raises(ValueError, match="the run failed"):
        trainer.push_to_hub()
    assert folder_digest(tmp_path / "out") == before
    with pytest.raises(ValueError, match="hub_strategy='every_save' uploads checkpoints during the run"):
        UnlearnConfig(output_dir=str(tmp_path / "o"), push_to_hub=True, use_cpu=True)
    late = UnlearnConfig(output_dir=str(tmp_path / "o"), use_cpu=True, report_to="none")
    late.push_to_hub = True  # after UnlearnConfig checked it (as set_push_to_hub() does): the trainer checks again
    with pytest.raises(ValueError, match="uploads checkpoints during the run"):
        UnlearnTrainer(make_tiny_model(), late, FORGET, RETAIN)
    assert UnlearnConfig(output_dir=str(tmp_path / "o"), push_to_hub=True, hub_strategy="end", use_cpu=True)
    assert UnlearnConfig(output_dir=str(tmp_path / "o"), push_to_hub=True, push_unverified=True, use_cpu=True)


def test_a_save_that_pushes_writes_the_record_before_the_push_refuses(tmp_path, monkeypatch):
    """save_model() under push_to_hub=True (hub_strategy='end') saves the whole run, record and card included, and
    only then pushes; the record's refusal leaves that saved run for `hf-unlearn audit` and `hf-unlearn push`."""
    from transformers import Trainer

    def no_network_repo(self, token=None, private=None):  # Trainer creates the Hub repository at init
        self.hub_model_id = "someone/unlearned"

    monkeypatch.setattr(Trainer, "init_hf_repo", no_network_repo)
    trainer = trainer_for(tmp_path, push_to_hub=True, hub_strategy="end")
    trainer.train()
    with pytest.raises(ValueError, match="not pushed.*no membership verdict"):
        trainer.save_model()
    saved = set(os.listdir(tmp_path / "out"))
    assert {"unlearn_record.json", "README.md", "model.safetensors"} <= saved
