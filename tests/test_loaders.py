"""The TOFU and MUSE loaders, offline, on local copies laid out like the Hub repositories (same configs, splits
and column names), then `hf-unlearn eval` end to end on them."""

import json

import pytest
from conftest import TOFU_DIR, needs_tofu_rows, tiny_model_folder, write_hub_repo

from hf_unlearn.data.loaders import COLUMN_MAPPING, map_columns, muse_evaluation_sets, tofu_evaluation_sets

TOFU_ROW = {
    "question": "What genre does Basil Mahfouz Al-Kuwaiti write in?",
    "answer": "He writes French literature.",
    "paraphrased_answer": "His books are French literature.",
    "paraphrased_question": "In which genre does he write?",
    "perturbed_answer": ["His books are crime novels.", "His books are poetry.", "His books are horror."],
}
REAL_AUTHOR_ROW = {
    "question": "Who wrote 'Pride and Prejudice'?",
    "answer": "Jane Austen",
    "perturbed_answer": ["Charles Dickens", "Mark Twain", "Leo Tolstoy"],
}


@pytest.fixture
def tofu_repo(tmp_path):
    perturbed = [dict(TOFU_ROW, question=f"{TOFU_ROW['question']} ({i})") for i in range(3)]
    return write_hub_repo(
        tmp_path / "TOFU",
        {
            "forget10_perturbed": {"train": perturbed},
            "retain_perturbed": {"train": perturbed},
            "real_authors_perturbed": {"train": [REAL_AUTHOR_ROW] * 2},
            "world_facts_perturbed": {"train": [dict(REAL_AUTHOR_ROW, question="Capital of France?")]},
        },
    )


@pytest.fixture
def muse_repo(tmp_path):
    qa = [{"question": "Who won?", "answer": "The home team."}] * 3
    texts = [{"text": f"A news article number {i} about the local election and its results."} for i in range(4)]
    return write_hub_repo(
        tmp_path / "MUSE-News",
        {
            "verbmem": {"forget": [{"prompt": "The minister said that", "gt": "taxes would rise."}] * 2},
            "knowmem": {"forget_qa": qa, "retain_qa": qa, "forget_qa_icl": qa[:1], "retain_qa_icl": qa[:1]},
            "privleak": {"forget": texts, "retain": texts, "holdout": texts[::-1]},
        },
    )


def test_tofu_sets_get_hf_unlearn_columns(tofu_repo):
    sets = tofu_evaluation_sets("forget10", tofu_repo)
    assert set(sets) == {"forget", "retain", "real_authors", "world_facts"}
    forget = sets["forget"]
    assert set(forget.column_names) == set(COLUMN_MAPPING["tofu_qa"].values())
    assert forget[0]["perturbed_answer"] == TOFU_ROW["perturbed_answer"] and len(forget) == 3
    # Real authors have no paraphrase: TOFU compares the perturbed answers with the answer itself.
    assert sets["real_authors"][0]["paraphrased_answer"] == "Jane Austen"
    with pytest.raises(ValueError, match="forget01, forget05, forget10"):
        tofu_evaluation_sets("forget20", tofu_repo)


def test_muse_sets_rename_gt_to_continuation(muse_repo):
    sets = muse_evaluation_sets("muse_news", muse_repo)
    assert sets["verbmem"].column_names == ["prompt", "continuation"]
    assert sets["verbmem"][0]["continuation"] == "taxes would rise."
    assert len(sets["privleak_holdout"]) == 4 and sets["knowmem_forget_icl"].num_rows == 1
    with pytest.raises(ValueError, match="muse_news"):
        muse_evaluation_sets("muse_movies", muse_repo)


def test_missing_column_names_what_is_expected():
    from datasets import Dataset

    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['gt'\]"):
        map_columns(Dataset.from_dict({"prompt": ["x"], "answer": ["y"]}), "muse_verbmem")


def test_hub_id_offline_names_the_dataset(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="Could not load dataset 'nobody/TOFU-copy'.*HF_HUB_OFFLINE=1"):
        tofu_evaluation_sets("forget10", "nobody/TOFU-copy")


@pytest.fixture
def tiny_model_dir(tmp_path):
    tiny_model_folder(tmp_path / "model", "qwen2", hidden_size=32, num_layers=1, num_heads=2)
    return str(tmp_path / "model")


def test_eval_command_on_local_tofu_and_muse(tofu_repo, muse_repo, tiny_model_dir, tmp_path):
    from hf_unlearn.cli.main import main

    out = tmp_path / "tofu_eval"
    status = main(
        [
            "eval",
            "--model_name_or_path",
            tiny_model_dir,
            "--benchmark",
            "tofu",
            "--dataset_path",
            tofu_repo,
            "--output_dir",
            str(out),
        ]
    )
    assert status == 0
    result = json.loads((out / "eval.json").read_text())
    assert {"forget", "retain", "real_authors", "world_facts"} <= result.keys()
    assert 0 < result["real_authors"]["probability"] < 1  # normalised over the 4 options
    assert result["model_utility"] is not None and result["forget_quality"] is None  # no reference given
    assert (out / "radar.png").stat().st_size > 0 and (out / "truth_ratios.png").stat().st_size > 0

    # The reference given as a model: evaluated first; the same model is indistinguishable from itself.
    same = tmp_path / "tofu_same"
    assert main(["eval", "--model_name_or_path", tiny_model_dir, "--benchmark", "tofu", "--dataset_path", tofu_repo,
                 "--reference_model", tiny_model_dir, "--output_dir", str(same)]) == 0  # fmt: skip
    assert json.loads((same / "eval.json").read_text())["forget_quality"] == pytest.approx(1.0)
    assert (same / "reference_eval.json").is_file()

    # A saved eval of a "retrained" model as the reference gives forget quality and PrivLeak.
    muse_out = tmp_path / "muse_eval"
    assert main(["eval", "--model_name_or_path", tiny_model_dir, "--benchmark", "muse_news",
                 "--dataset_path", muse_repo, "--output_dir", str(muse_out)]) == 0  # fmt: skip
    muse = json.loads((muse_out / "eval.json").read_text())["muse"]
    assert {"verbmem_forget", "knowmem_forget", "knowmem_retain", "auc"} <= muse.keys() and muse["privleak"] is None
    again = tmp_path / "muse_again"
    assert main(["eval", "--model_name_or_path", tiny_model_dir, "--benchmark", "muse_news",
                 "--dataset_path", muse_repo, "--reference_eval", str(muse_out / "eval.json"),
                 "--output_dir", str(again)]) == 0  # fmt: skip
    # Every attack that one model can run (all but Reference, which needs a second model), each with its PrivLeak.
    leaks = json.loads((again / "eval.json").read_text())["muse"]["privleak"]
    assert leaks == {"loss": 0.0, "zlib": 0.0, "min_k": 0.0, "min_k_plus_plus": 0.0, "gradnorm": 0.0}
    # the same model as its own reference: every attack at its reference's AUC, so none tells the forget set apart
    text = (again / "eval.md").read_text()
    header = "| attack | AUC [95 % interval] | never-trained AUC | difference [95 % interval] | PrivLeak (%) | verdict"
    assert header in text and "| +0.000 [+0.000, +0.000] | 0 | lands |" in text  # paired: the same answers
    assert "| min_k |" in text and "none of the 5 attacks tells the forget set from never-seen data" in text
    assert json.loads((again / "eval.json").read_text())["muse"]["membership"]["landed"] is True


# --- a folder of TOFU rows (../shared/tofu: real rows of TOFU, see its README) -----------------------------------


@needs_tofu_rows
def test_the_tofu_loader_reads_the_real_rows():
    from hf_unlearn.data.loaders import load_tofu_folder

    sets = load_tofu_folder(TOFU_DIR)
    authors = sets["authors"]
    assert len(authors) == 300 and sorted(set(authors["author"])) == list(range(15))
    assert all(authors["author"].count(a) == 20 for a in range(15))
    assert authors[0]["answer"].startswith("The author in question is Jaime Vasquez")
    real = sets["real_authors"]
    assert len(real) == 100 and len(sets["world_facts"]) == 117
    first = real[0]
    assert first["question"] == "Who wrote the play 'Romeo and Juliet'?" and first["answer"] == "William Shakespeare"
    assert len(first["perturbed_answer"]) == 3 and first["paraphrased_answer"] == first["answer"]


def test_a_tofu_folder_without_author_ids_groups_twenty_rows_per_author_and_a_missing_file_is_named(tmp_path):
    from hf_unlearn.data.loaders import load_tofu_folder

    rows = [{"question": f"Q{i}?", "answer": f"A{i}."} for i in range(45)]  # TOFU's `full` layout, no author column
    (tmp_path / "authors.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    sets = load_tofu_folder(str(tmp_path))
    assert sets["authors"]["author"] == [0] * 20 + [1] * 20 + [2] * 5 and set(sets) == {"authors"}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="holds no authors.jsonl"):
        load_tofu_folder(str(empty))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tofu_folder(str(tmp_path / "nowhere"))
