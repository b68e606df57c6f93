"""`examples/text-embeddings/run_retrieval.py`: SQuAD's questions retrieve their paragraphs with all-MiniLM-L6-v2's
sentence embeddings; its recall is far above chance, and a slice without questions is one line, exit 2."""

from __future__ import annotations

import json

from ..conftest import REPO_ROOT
from ..helpers import run_example

FOLDER = REPO_ROOT / "examples" / "text-embeddings"


def test_questions_retrieve_their_paragraphs(tmp_path, shared_data, minilm_dir):
    squad = shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json"
    common = ["--model_name_or_path", str(minilm_dir), "--squad_file", str(squad)]
    run = run_example(FOLDER, "run_retrieval.py", *common, "--articles", "34:36", "--output_dir", str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "all_results.json").read_text())
    assert results["questions"] > 300 and results["paragraphs"] > 60
    # chance would be about 1 / paragraphs (recall@1 ~0.01): the embeddings find the paragraph most of the time
    assert results["recall@1"] > 0.5 and results["recall@5"] > results["recall@1"] and results["mrr"] > 0.6
    empty = run_example(FOLDER, "run_retrieval.py", *common, "--articles", "40:", "--output_dir", str(tmp_path / "x"))
    assert empty.returncode == 2 and empty.stderr.strip().endswith("give a slice such as 34:40")
    assert not (tmp_path / "x").exists()  # nothing written for a bad input
