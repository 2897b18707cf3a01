"""Twin scripts: finetune.py trains on question/answer pairs, unlearn.py makes the model forget the same pairs.

`diff examples/finetune.py examples/unlearn.py` is the whole migration: swap the trainer and its arguments, drop
the epoch count (the run stops itself; its budget is 1000 steps), and add the data to keep.
"""

from transformers import DataCollatorForSeq2Seq
from hf_unlearn import UnlearnConfig, UnlearnTrainer

from hf_unlearn import build_qa_dataset
from hf_unlearn.benchmarks import learn_target_model, load_split

# Any causal LM works: AutoModelForCausalLM.from_pretrained(...) and its tokenizer. Here, offline: the tiny
# model that learned the embedded fictitious-authors benchmark (trained once, then cached).
model, tokenizer, _ = learn_target_model()

train_dataset = build_qa_dataset(load_split("forget10"), tokenizer)
retain_dataset = build_qa_dataset(load_split("retain90"), tokenizer)

trainer = UnlearnTrainer(
    model=model,
    args=UnlearnConfig(output_dir="out-unlearn", report_to="none"),
    train_dataset=train_dataset,
    retain_dataset=retain_dataset,
    data_collator=DataCollatorForSeq2Seq(tokenizer),
    processing_class=tokenizer,
)
trainer.train()
trainer.save_model()
