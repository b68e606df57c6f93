"""Every notebook of Optimum Graphcore (`tests/notebooks/optimum_graphcore/`) and how it runs here: the table of
docs/migrating.md ("Notebooks") is checked against this one (`test_registry.py`).

A notebook `runs` (after the one changed import, offline against stand-in downloads only), `runs with stand-ins`
(some cell texts replaced, each with its reason: data not in `../shared/data`, a full-size training cut to a few
steps, an API its libraries have since removed), `does not apply` (IPU-only: said why), or is `not run yet` (no test
runs it today: said why, counted apart, never called done).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

NOTEBOOKS_DIR = Path(__file__).parent / "optimum_graphcore"

RUNS, STAND_INS, NOT_APPLICABLE, NOT_RUN = "runs", "runs with stand-ins", "does not apply", "not run yet"

# cells that only drive Graphcore's cloud: their reason, said once per cell at run time
GC_MONITOR = ("gc-monitor", "`gc-monitor` lists IPUs attached to this process; there are none to list")
DETACH = (
    ".model.detachFromDevice()",
    "poptorch's release of the IPUs a pipeline's model held: the model here is the stock `transformers` one and "
    "holds no device of its own (its memory goes with the pipeline)",
)
NOTEBOOK_LOGIN = ("notebook_login()", "a Hub login, and the run is offline (nothing is pushed)")


@dataclass(frozen=True)
class Notebook:
    """How one notebook runs here.

    Args:
        path: under `optimum_graphcore/`.
        status: one of RUNS, STAND_INS, NOT_APPLICABLE, NOT_RUN.
        why: what docs/migrating.md says of it (the stand-ins in a few words, or why it does not run).
        models: Hub ids the notebook downloads, served by `standins.MODELS` from a local cache.
        replace: `(old text, new text, reason)` applied to its cells (stand-ins beyond downloads).
        not_applicable: `(text, reason)`: a cell holding the text is not run, and the reason is said.
    """

    path: str
    status: str
    why: str
    models: tuple[str, ...] = ()
    replace: tuple[tuple[str, str, str], ...] = ()
    not_applicable: tuple[tuple[str, str], ...] = field(default=())

    def spec(self, cwd: Path, hub_cache: Path) -> dict:
        return {
            "notebook": str(NOTEBOOKS_DIR / self.path),
            "cwd": str(cwd),
            "hub_cache": str(hub_cache),
            "replace": [list(r) for r in self.replace],
            "not_applicable": [list(n) for n in self.not_applicable],
        }


SENTIMENT_MODELS = (
    "distilbert-base-uncased-finetuned-sst-2-english",
    "finiteautomata/bertweet-base-sentiment-analysis",
    "cardiffnlp/twitter-roberta-base-sentiment-latest",
    "nlptown/bert-base-multilingual-uncased-sentiment",
    "bhadresh-savani/distilbert-base-uncased-emotion",
    "j-hartmann/sentiment-roberta-large-english-3-classes",
)

NOTEBOOKS = [
    Notebook(
        "sentiment_analysis.ipynb",
        RUNS,
        "six sentiment models through `pipelines.pipeline`, with an inference IPU config as a dict",
        models=SENTIMENT_MODELS,
        not_applicable=(GC_MONITOR, DETACH),
    ),
    Notebook(
        "managing_ipu_resources.ipynb",
        RUNS,
        "pipelines attached and detached; its `gc-monitor` cells list IPUs and are not run",
        models=("distilbert-base-uncased-finetuned-sst-2-english",),
        not_applicable=(GC_MONITOR, DETACH),
    ),
]

LIBRISPEECH_DUMMY = (
    'ds = load_dataset("hf-internal-testing/librispeech_asr_dummy", "clean", split="validation")',
    "from tests.notebooks.standins import speech_samples\nds = speech_samples()",
    "LibriSpeech's dummy split is not in ../shared/data, and `datasets` decodes audio with FFmpeg: the JFK clip "
    "(as its row 2) among FSDD recordings, decoded with soundfile",
)
NOTEBOOKS += [
    Notebook(
        "whisper-example.ipynb",
        STAND_INS,
        "OpenAI's whisper-tiny.en (../shared/models) transcribes; the JFK clip stands in for LibriSpeech's dummy split",
        models=("openai/whisper-tiny.en",),
        replace=(LIBRISPEECH_DUMMY,),
    ),
]

BY_PATH = {notebook.path: notebook for notebook in NOTEBOOKS}
