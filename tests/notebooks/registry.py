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
        folders: made in the folder it runs in, as its repository folder has them (`sample_images/`).
    """

    path: str
    status: str
    why: str
    models: tuple[str, ...] = ()
    replace: tuple[tuple[str, str, str], ...] = ()
    not_applicable: tuple[tuple[str, str], ...] = field(default=())
    folders: tuple[str, ...] = ()  # folders of the notebook's own repository folder that it writes into

    def spec(self, cwd: Path, hub_cache: Path) -> dict:
        return {
            "notebook": str(NOTEBOOKS_DIR / self.path),
            "cwd": str(cwd),
            "hub_cache": str(hub_cache),
            "replace": [list(r) for r in self.replace],
            "not_applicable": [list(n) for n in self.not_applicable],
            "folders": list(self.folders),
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
        "whisper-quantized-example.ipynb",
        STAND_INS,
        "OpenAI's whisper-tiny.en (../shared/models) with its linear weights quantized to int8 "
        "(`use_group_quantized_linears=True`) transcribes; the JFK clip stands in for LibriSpeech's dummy split",
        models=("openai/whisper-tiny.en",),
        replace=(LIBRISPEECH_DUMMY,),
    ),
    Notebook(
        "whisper-example.ipynb",
        STAND_INS,
        "OpenAI's whisper-tiny.en (../shared/models) transcribes; the JFK clip stands in for LibriSpeech's dummy split",
        models=("openai/whisper-tiny.en",),
        replace=(LIBRISPEECH_DUMMY,),
    ),
]

NOTEBOOKS += [
    Notebook(
        "text_embeddings_models/text-embeddings-on-ipu.ipynb",
        NOT_APPLICABLE,
        "it drives poptorch itself (`poptorch.inferenceModel`, `poptorch.DataLoader`, `IPUConfig.to_options`) and its "
        "folder's `config.py`; here the same search is `pipeline(\"sentence-embeddings\")` (sentence-transformers' "
        "embeddings to 1e-5) and `examples/text-embeddings/run_retrieval.py`",
    ),
]

# Stable Diffusion: the notebooks' checkpoints are tiny random diffusers folders under their ids (at revision fp16)
COCO = "str(SHARED_DATA / 'fixtures' / 'images' / 'coco-000000039769.png')"
SKETCH_DOWNLOAD = (
    'response = requests.get(url)\ninit_image = Image.open(BytesIO(response.content)).convert("RGB")',
    f'from tests.conftest import SHARED_DATA\ninit_image = Image.open({COCO}).convert("RGB")',
    "the sketch is downloaded from GitHub, and the run is offline: the COCO photo of ../shared/data",
)
INPAINT_DOWNLOADS = (
    "def download_image(url):\n    response = requests.get(url)\n    return Image.open(BytesIO(response.content))"
    '.convert("RGB")',
    "from tests.notebooks.standins import inpainting_image as download_image",
    "the photo and its mask are downloaded from GitHub, and the run is offline: the COCO photo of ../shared/data "
    "and a mask of its middle",
)
SD_WHY = "tiny random UNet, VAE and CLIP text encoder under the notebook's checkpoint id"
NOTEBOOKS += [
    Notebook(
        "stable_diffusion/text_to_image.ipynb",
        RUNS,
        SD_WHY,
        models=("runwayml/stable-diffusion-v1-5",),
        not_applicable=(NOTEBOOK_LOGIN,),
        folders=("sample_images",),
    ),
    Notebook(
        "stable_diffusion/text_to_image_sd2.ipynb",
        RUNS,
        SD_WHY + " (SD 2: 768 pixels), diffusers' DPM-Solver scheduler swapped in as the notebook does",
        models=("stabilityai/stable-diffusion-2",),
        not_applicable=(NOTEBOOK_LOGIN,),
        folders=("sample_images",),
    ),
    Notebook(
        "stable_diffusion/image_to_image.ipynb",
        STAND_INS,
        SD_WHY + "; the COCO photo of ../shared/data in place of the downloaded sketch",
        models=("runwayml/stable-diffusion-v1-5",),
        replace=(SKETCH_DOWNLOAD,),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
    Notebook(
        "stable_diffusion/inpainting.ipynb",
        STAND_INS,
        SD_WHY + " (a 9-channel UNet); the COCO photo and a drawn mask in place of the downloaded ones",
        models=("runwayml/stable-diffusion-inpainting",),
        replace=(INPAINT_DOWNLOADS,),
        not_applicable=(NOTEBOOK_LOGIN,),
        folders=("sample_images",),
    ),
]

# The text training notebooks (test_text_training_notebooks.py): tiny stand-ins under their model ids, the shared
# data (or transformers' fixture rows) in place of the Hub's data sets, a few optimizer steps of a few dozen rows
LOAD_METRIC = (
    "from datasets import load_dataset, load_metric",
    "from datasets import load_dataset\nfrom tests.notebooks.standins import load_metric",
    "`datasets.load_metric` is gone since datasets 3, and its successor `evaluate.load` fetches the metric's script "
    "from the Hub: the same metric computed locally",
)
WIKITEXT = (
    "datasets = load_dataset('wikitext', 'wikitext-2-raw-v1')",
    "from tests.notebooks.standins import wikitext2\ndatasets = wikitext2(rows=100)",
    "WikiText-2 is downloaded from the Hub: its valid and test lines of ../shared/data (tokenised text) through "
    'load_dataset("text"), the first 100 lines of each',
)
BLOCK_128 = ("block_size = 128", "block_size = 32", "blocks of 32 tokens for the tiny stand-in model")
ONE_PROCESS_MAPS = (
    "num_proc=4,",
    "num_proc=1,",
    "4 processes to map a few hundred lines on a small machine: mapped in this one",
)
TRAIN_STEPS = "a full training cut to {} optimizer steps"
NOTEBOOKS += [
    Notebook(
        "text_classification.ipynb",
        STAND_INS,
        "RoBERTa fine-tuned on GLUE SST-2 of ../shared/data (CoLA is not there) for 2 steps, then evaluated",
        models=("roberta-base",),
        replace=(
            ('task = "cola"', 'task = "sst2"', "GLUE CoLA is not in ../shared/data: SST-2, one sentence a row too"),
            ("max_seq_length = 512", "max_seq_length = 64", "sequences of 64 tokens for the tiny stand-in model"),
            LOAD_METRIC,
            (
                'dataset = load_dataset("glue", actual_task)',
                "from tests.notebooks.standins import glue_sst2\ndataset = glue_sst2(rows=32)",
                "GLUE is downloaded from the Hub: SST-2 of ../shared/data, its first 32 rows of each split",
            ),
            ("num_train_epochs=5,", "max_steps=2,", TRAIN_STEPS.format(2)),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
]

# The seq2seq notebooks (test_seq2seq_notebooks.py): tiny T5 / BART / mT5 stand-ins with their IPU configs' layer
# counts, WMT16 en-ro of ../shared/data and XSum's fixture rows, metrics computed locally, a few optimizer steps
GENERATION_METRIC = (
    "from datasets import load_dataset, load_metric",
    "from datasets import load_dataset\nfrom tests.notebooks.standins import local_metric as load_metric",
    "`datasets.load_metric` is gone since datasets 3, and its successor `evaluate.load` fetches the metric's script "
    "from the Hub: the same metric computed locally (rouge_score, sacrebleu)",
)
AS_TARGET = (
    "with tokenizer.as_target_tokenizer():",
    "if True:  # transformers 5 removed `as_target_tokenizer()`, a no-op for this tokenizer",
    "transformers 5 removed `as_target_tokenizer()`; for T5, mT5 and BART tokenizers it changed nothing",
)


def wmt16(train_rows: int) -> tuple[str, str, str]:
    return (
        'raw_datasets = load_dataset("wmt16", "ro-en")',
        f"from tests.notebooks.standins import wmt16_ro_en\nraw_datasets = wmt16_ro_en(train_rows={train_rows})",
        f"WMT16 is downloaded from the Hub: newsdev2016 (as train: its first {train_rows} lines) and newstest2016 "
        "(its first 8) of ../shared/data",
    )


FEW_MICRO_BATCHES = "2 micro-batches a step, not {}: a few dozen rows on a CPU"
SHORT_SEQUENCES = "short sequences for the tiny stand-in model on a CPU"
NOTEBOOKS += [
    Notebook(
        "summarization.ipynb",
        STAND_INS,
        "a tiny T5 fine-tuned on XSum's fixture rows for 2 steps, evaluated with generation and ROUGE",
        models=("t5-small",),
        replace=(
            GENERATION_METRIC,
            (
                'raw_datasets = load_dataset("xsum")',
                "from tests.notebooks.standins import xsum\nraw_datasets = xsum()",
                "XSum is downloaded from the Hub: its 10 real rows of transformers' test fixtures (../shared/data)",
            ),
            AS_TARGET,
            (
                "max_input_length = 1024\nmax_target_length = 128",
                "max_input_length = 128\nmax_target_length = 16",
                SHORT_SEQUENCES,
            ),
            ("gradient_accumulation_steps = 16", "gradient_accumulation_steps = 2", FEW_MICRO_BATCHES.format(16)),
            ("num_train_epochs=1,", "max_steps=2,", TRAIN_STEPS.format(2)),
            (
                "nltk.download('punkt')",
                "from tests.notebooks.standins import nltk_sentences; nltk.sent_tokenize = nltk_sentences",
                "NLTK's punkt model is a download: sentences split at their final punctuation",
            ),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
    Notebook(
        "translation.ipynb",
        STAND_INS,
        "a tiny BART fine-tuned on WMT16 en-ro of ../shared/data for 2 steps, evaluated with generation and BLEU",
        models=("facebook/bart-base",),
        replace=(
            GENERATION_METRIC,
            wmt16(8),
            AS_TARGET,
            (
                "max_input_length = 128\nmax_target_length = 128",
                "max_input_length = 64\nmax_target_length = 16",
                SHORT_SEQUENCES,
            ),
            ("gradient_accumulation_steps = 128", "gradient_accumulation_steps = 2", FEW_MICRO_BATCHES.format(128)),
            ("num_train_epochs=1,", "max_steps=2,", TRAIN_STEPS.format(2)),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
    Notebook(
        "mt5_translation.ipynb",
        STAND_INS,
        "a tiny mT5 fine-tuned ro -> en on WMT16 of ../shared/data for 2 steps, evaluated with generation and BLEU",
        models=("google/mt5-small",),
        replace=(
            GENERATION_METRIC,
            wmt16(20),  # a step: 10 device iterations (its IPU config) x 2 micro-batches
            AS_TARGET,
            ("    max_length = 128\n", "    max_length = 16\n", SHORT_SEQUENCES),
            (
                "gradient_accumulation_steps = 128 // replication_factor",
                "gradient_accumulation_steps = 2",
                FEW_MICRO_BATCHES.format(128),
            ),
            ("num_train_epochs=2,", "max_steps=1,", TRAIN_STEPS.format(1)),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
]

NOTEBOOKS += [
    Notebook(
        "token_classification.ipynb",
        STAND_INS,
        "BERT fine-tuned for NER for 2 steps on CoNLL-2003 rows of transformers' fixtures, evaluated with seqeval",
        models=("bert-base-uncased",),
        replace=(
            ("max_seq_length = 128", "max_seq_length = 64", "sequences of 64 tokens for the tiny stand-in model"),
            LOAD_METRIC,
            (
                'datasets = load_dataset("conll2003")',
                "from tests.notebooks.standins import conll2003\ndatasets = conll2003()",
                "CoNLL-2003 is downloaded from the Hub: its 10 sentences of ../shared/data/fixtures (tokens, NER tags)",
            ),
            ("num_train_epochs=3,", "max_steps=2,", TRAIN_STEPS.format(2)),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
    Notebook(
        "question_answering.ipynb",
        STAND_INS,
        "RoBERTa fine-tuned on SQuAD v1.1 dev articles of ../shared/data for 1 step, predictions post-processed and "
        "scored with SQuAD's metric",
        models=("roberta-base",),
        replace=(
            LOAD_METRIC,
            (
                'datasets = load_dataset("squad_v2" if squad_v2 else "squad")',
                "from tests.notebooks.standins import squad\ndatasets = squad(train_rows=12, validation_rows=6)",
                "SQuAD is downloaded from the Hub (its train set is nowhere offline): the v1.1 dev articles of "
                "../shared/data, 0-33 as train and 34-39 as validation, their first questions",
            ),
            ("max_length = 384 ", "max_length = 128 ", "features of 128 tokens for the tiny stand-in model"),
            ("doc_stride = 128 ", "doc_stride = 32 ", "the stride of those shorter features"),
            ("num_train_epochs=3,", "max_steps=1,", TRAIN_STEPS.format(1)),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
    Notebook(
        "multiple_choice.ipynb",
        STAND_INS,
        "RoBERTa fine-tuned for 1 step on SWAG rows of transformers' fixtures, then evaluated",
        models=("roberta-base",),
        replace=(
            LOAD_METRIC,
            (
                'datasets = load_dataset("swag", "regular")',
                "from tests.notebooks.standins import swag\ndatasets = swag()",
                "SWAG is downloaded from the Hub: its 10 rows of ../shared/data/fixtures, with SWAG's columns",
            ),
            ("max_seq_length = 128\n", "max_seq_length = 64\n", "sequences of 64 tokens for the tiny stand-in model"),
            ("num_train_epochs=3,", "max_steps=1,", TRAIN_STEPS.format(1)),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
    Notebook(
        "language_modeling.ipynb",
        STAND_INS,
        "GPT-2 and RoBERTa stand-ins fine-tuned 2 steps each on WikiText-2 (../shared/data) in blocks of 32 tokens",
        models=("gpt2", "roberta-base"),
        replace=(
            WIKITEXT,
            BLOCK_128,
            ONE_PROCESS_MAPS,
            ("logging_steps=10,", "logging_steps=10,\n    max_steps=2,", "a full training (3 epochs) cut to 2 steps"),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
    Notebook(
        "language_modelling_from_scratch.ipynb",
        STAND_INS,
        "GPT-2 and BERT configs trained from scratch 1 step each on WikiText-2 (../shared/data) in blocks of 32 tokens",
        models=("gpt2", "sgugger/gpt2-like-tokenizer", "bert-base-cased", "sgugger/bert-like-tokenizer"),
        replace=(
            WIKITEXT,
            BLOCK_128,
            ONE_PROCESS_MAPS,
            (
                "dataloader_workers = 64",
                "dataloader_workers = 0",
                "64 loader processes for a few dozen rows on a small machine: rows loaded in the main process",
            ),
            ("num_train_epochs=10,", "max_steps=1,", TRAIN_STEPS.format(1)),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
    Notebook(
        "introduction_to_optimum_graphcore.ipynb",
        STAND_INS,
        "BERT-large fine-tuned on SQuAD v1.1 dev articles of ../shared/data for 2 epochs of one step (global batch 16),"
        " scored with SQuAD's metric, then asked a question; its `squad_preprocessing.py` vendored beside it",
        models=("Graphcore/bert-large-uncased", "bert-base-uncased"),
        replace=(
            LOAD_METRIC,
            (
                "from datasets import load_metric\n",
                "from tests.notebooks.standins import load_metric\n",
                "`datasets.load_metric` is gone since datasets 3 (see above)",
            ),
            (
                'datasets = load_dataset("squad")',
                "from tests.notebooks.standins import squad\ndatasets = squad(train_rows=16, validation_rows=6)",
                "SQuAD is downloaded from the Hub (its train set is nowhere offline): the v1.1 dev articles of "
                "../shared/data, 0-33 as train and 34-39 as validation, their first questions",
            ),
            ('datasets["train"][10016]', 'datasets["train"][10]', "the stand-in train split has 16 rows"),
            (
                "from squad_preprocessing import",
                "from tests.notebooks.optimum_graphcore.squad_preprocessing import",
                "the notebook's helper module, beside it in Optimum Graphcore's notebooks folder (vendored here at "
                "tests/notebooks/optimum_graphcore/squad_preprocessing.py); the run's folder is a temporary one",
            ),
            ("global_batch_size = 256", "global_batch_size = 16", "a global batch of 16 for a few dozen features"),
            (
                "dataloader_num_workers=32,",
                "dataloader_num_workers=0,",
                "32 loader processes for a few dozen rows on a small machine: rows loaded in the main process",
            ),
            ('output_dir="/tmp/outputs"', 'output_dir="outputs"', "the run's own folder, not one /tmp for every run"),
            ('from_pretrained("/tmp/outputs")', 'from_pretrained("outputs")', "the run's own folder (see above)"),
            (
                "tokenizer.encode_plus((question, answer_text))",
                "tokenizer(question, answer_text)",
                "transformers 5 removed `encode_plus`; calling the tokenizer is what it did",
            ),
        ),
        not_applicable=(NOTEBOOK_LOGIN,),
    ),
]

NOTEBOOKS += [
    Notebook(
        "flan_t5_inference.ipynb",
        STAND_INS,
        'a tiny Flan-T5 (t5-large\'s 24 + 24 layers) answers its prompts through `pipeline("text2text-generation")`',
        models=("google/flan-t5-large",),
        replace=(
            (
                "max_input_length=896,",
                "max_input_length=128, max_new_tokens=8,",
                "inputs padded to 128 tokens, not 896, and answers of 8 new tokens, not 20: " + SHORT_SEQUENCES,
            ),
            (
                'self.example_prompts = os.getenv("EXAMPLE_PROMPTS")',
                'self.example_prompts = os.getenv("EXAMPLE_PROMPTS", "Where is Graphcore located?")',
                "the chat reads `input()` unless EXAMPLE_PROMPTS (the notebook's own route for a run without a "
                "person) gives the prompts: one prompt",
            ),
        ),
        not_applicable=(DETACH,),
    ),
    Notebook(
        "text_summarization.ipynb",
        STAND_INS,
        'a tiny BART (bart-large-cnn\'s 12 + 12 layers) summarizes with beam search through `pipeline("summarization")`'
        "; a WikiText-2 article stands in for the Wikipedia page and the medical reports",
        models=("facebook/bart-large-cnn",),
        replace=(
            (
                "max_input_length=1024,",
                "max_input_length=256,",
                "inputs padded to 256 tokens, not 1,024: " + SHORT_SEQUENCES,
            ),
            ('"max_length": 150,', '"max_length": 24,', "summaries of 24 tokens, not 150: " + SHORT_SEQUENCES),
            ("max_length=150,", "max_length=24,", "summaries of 24 tokens, not 150: " + SHORT_SEQUENCES),
            (
                "import wikipedia\n",
                "from tests.notebooks.standins import wikipedia\n",
                "`wikipedia.page(...)` is a download: WikiText-2's first article (../shared/data), whatever the title",
            ),
            (
                'dataset = load_dataset("rungalileo/medical_transcription_40")',
                "from tests.notebooks.standins import wikitext_documents\ndataset = wikitext_documents()",
                "the medical reports are downloaded from the Hub: 8 WikiText-2 articles (../shared/data) as `text`",
            ),
            (
                'random.randint(0, len(dataset["train"]))',
                'random.randint(0, len(dataset["train"]) - 1)',
                "the notebook's off-by-one: `randint` includes its upper bound, so 1 run in 41 indexed past the end",
            ),
        ),
        not_applicable=(DETACH,),
    ),
]

GRADIO = "a Gradio web app for a person to try the pipeline in a browser (gradio is not installed: no one to click)"
POPTORCH_IMPORT = (
    "import poptorch\n",
    "",
    "poptorch is the IPU's PyTorch: nothing here uses it once its one call goes",
)
NOTEBOOKS += [
    Notebook(
        "name-entity-extraction.ipynb",
        STAND_INS,
        "three NER pipelines (the default CoNLL BERT-large, a multilingual BERT, a biomedical DistilBERT) on one IPU "
        "slot, padded to 256 tokens; the Gradio apps are defined but not launched",
        models=(
            "dbmdz/bert-large-cased-finetuned-conll03-english",
            "Davlan/bert-base-multilingual-cased-ner-hrl",
            "d4data/biomedical-ner-all",
        ),
        replace=(("import gradio as gr\n", "", "gradio is not installed: its app is defined, never launched"),),
        not_applicable=(("launch(share=share_gradio)", GRADIO), DETACH),
    ),
    Notebook(
        "deberta-blog-notebook.ipynb",
        STAND_INS,
        "DeBERTa MNLI and SQuAD checkpoints in half precision pipelined over 2 slots with `to_pipelined`, without "
        "poptorch's compile step",
        models=("microsoft/deberta-base-mnli", "Palak/microsoft_deberta-base_squad"),
        replace=(
            POPTORCH_IMPORT,
            (
                "pipelined_model = poptorch.inferenceModel(pipelined_model, options=ipu_config.to_options("
                "for_inference=True))",
                "",
                "poptorch's compile of the pipelined model for IPUs (with the config's poptorch options): here the "
                "pipelined model runs as it is",
            ),
            (
                'truncation_strategy="only_first"',
                'truncation="only_first"',
                "transformers 5 no longer reads the legacy `truncation_strategy` keyword (4 read it as `truncation`)",
            ),
        ),
    ),
    Notebook(
        "external_model.ipynb",
        NOT_RUN,
        "its model of its own subclasses `PipelineMixin` beside its `nn.Module` (`class IPUTransformerModel("
        "TransformerModel, PipelineMixin)`, Optimum Graphcore's way to pipeline a model of one's own, with a "
        "`parallelize()` that places modules with `poptorch.BeginBlock`); here `PipelineMixin` is the base of the "
        "generated `Pipelined<Class>` wrappers and takes the stock model as its argument, so the class cannot be built "
        "(TypeError: `PipelineMixin.__init__()` missing `model`). The same model without the mixin trains with "
        "`IPUTrainer` on a derived stage plan (its `transformer_encoder.layers`)",
    ),
]

# The vision and audio notebooks (test_vision_audio_notebooks.py): tiny ViT / HuBERT / Wav2Vec2 / Whisper stand-ins
# (a preprocessor saved beside each), FSDD's spoken digits and UCI's handwritten digits of ../shared/data
FSDD_DECODED = "decoded with soundfile at 16 kHz (`datasets` decodes audio with FFmpeg, which is absent)"
NOTEBOOKS += [
    Notebook(
        "audio_classification.ipynb",
        STAND_INS,
        "a tiny HuBERT fine-tuned for 2 steps to spot spoken digits (FSDD) in place of SUPERB's keywords, evaluated",
        models=("facebook/hubert-base-ls960",),
        replace=(
            GENERATION_METRIC,
            (
                'dataset = load_dataset("superb", "ks")',
                "from tests.notebooks.standins import keyword_spotting\ndataset = keyword_spotting()",
                "SUPERB's keyword spotting is downloaded from the Hub: Free Spoken Digit recordings of ../shared/data "
                "(16 rows a split; labels `zero` ... `nine`), " + FSDD_DECODED,
            ),
            ('dataset["test"][1000]', 'dataset["test"][10]', "the local test split has 16 rows, not SUPERB's 3,081"),
            (
                "per_device_eval_batch_size=8",
                "per_device_eval_batch_size=1",
                "evaluation batches of 16 rows (its IPU config: 4 device iterations x 4 replicas), not 128: the "
                "local validation split has 16",
            ),
            ("num_proc=64", "num_proc=1", "one process, not 64, for a few dozen rows on a CPU"),
            ("dataloader_num_workers=64,", "dataloader_num_workers=0,", "no loader processes for a few dozen rows"),
            ("gradient_accumulation_steps=16", "gradient_accumulation_steps=2", FEW_MICRO_BATCHES.format(16)),
            ("num_train_epochs=5,", "max_steps=2,", TRAIN_STEPS.format(2)),
        ),
        not_applicable=(
            NOTEBOOK_LOGIN,
            (
                "if trainer.args.push_to_hub:",
                "a push to the Hub, commented out (the cell's `if` is left without a body)",
            ),
        ),
    ),
]

NOTEBOOKS += [
    Notebook(
        "whisper_finetuning.ipynb",
        STAND_INS,
        "a tiny Whisper (small's 12 + 12 layers, whisper-tiny.en's tokenizer) evaluated with generation and WER, then "
        "fine-tuned for 1 step, on spoken digits (FSDD) in place of OpenSLR's Catalan",
        models=("openai/whisper-small",),
        replace=(
            (
                "split_dataset = Dataset.train_test_split(\n"
                '    load_dataset("openslr", "SLR69", split="train", token=False)',
                "from tests.notebooks.standins import spoken_sentences\nsplit_dataset = Dataset.train_test_split(\n"
                '    spoken_sentences(37, {"file": "path", "audio": "audio", "text": "sentence"})',
                "OpenSLR's SLR69 is downloaded from the Hub: 37 Free Spoken Digit recordings of ../shared/data with "
                "their words (29 train, 8 eval: one batch each), in its `path`, `audio`, `sentence` columns, "
                + FSDD_DECODED,
            ),
            (
                'dataset = dataset.cast_column("audio", Audio(sampling_rate=16000))',
                "dataset = dataset  # the recordings are decoded at 16 kHz already",
                "the recordings are at 16 kHz already; an `Audio` column would decode them with FFmpeg, which is "
                "absent",
            ),
            (
                'metric = evaluate.load("wer")',
                'from tests.notebooks.standins import local_metric\nmetric = local_metric("wer")',
                "`evaluate.load` fetches the metric's script from the Hub: word error rate computed locally (jiwer)",
            ),
            (
                "model.config.max_length = MAX_LENGTH\n",
                "",
                "transformers 5 refuses generation settings on the model's config; the notebook sets the same on its "
                "`generation_config` too",
            ),
            (
                "model.config.forced_decoder_ids = processor.tokenizer.get_decoder_prompt_ids(\n"
                "    language=LANGUAGE, task=TASK\n)\nmodel.config.suppress_tokens = []\n",
                "",
                "transformers 5 refuses generation settings on the model's config; the notebook sets the same on its "
                "`generation_config` too",
            ),
            ("MAX_LENGTH = 224", "MAX_LENGTH = 16", "labels and generations of 16 tokens, not 224: " + SHORT_SEQUENCES),
            (
                '"gradient_accumulation_steps": 16,',
                '"gradient_accumulation_steps": 1,',
                "1 micro-batch a step, not 16: a few dozen rows on a CPU",
            ),
            (
                "total_steps = 1000 // replication_factor",
                "total_steps = 1 // replication_factor",
                TRAIN_STEPS.format(1),
            ),
            ("dataloader_num_workers=16,", "dataloader_num_workers=0,", "no loader processes for a few dozen rows"),
            (
                "tokenizer._normalize(",
                "tokenizer.basic_normalize(",
                "transformers 5 renamed WhisperTokenizer's `_normalize` (`normalize`), and its English normalizer "
                "reads a spelling table (`normalizer.json`) that whisper-tiny.en's local files lack: the basic one",
            ),
        ),
    ),
]

NOTEBOOKS += [
    Notebook(
        "wav2vec2/wav2vec2-fine-tuning-checkpoint.ipynb",
        STAND_INS,
        "a tiny Wav2Vec2 fine-tuned with CTC for 2 steps on spoken digits (FSDD) in place of LibriSpeech, its "
        "character vocabulary built from them",
        models=("facebook/wav2vec2-base",),
        replace=(
            (
                "from datasets import DatasetDict, load_dataset, load_metric",
                "from datasets import DatasetDict, load_dataset\n"
                "from tests.notebooks.standins import local_metric as load_metric",
                GENERATION_METRIC[2],
            ),
            (
                'raw_datasets["train"] = load_dataset("librispeech_asr", "clean", split="train.100")\n'
                'raw_datasets["eval"] = load_dataset("librispeech_asr", "clean", split="validation")',
                "from tests.notebooks.standins import spoken_sentences\n"
                'raw_datasets["train"] = spoken_sentences(16, {"file": "file", "audio": "audio", "text": "text"})\n'
                'raw_datasets["eval"] = spoken_sentences(\n'
                '    16, {"file": "file", "audio": "audio", "text": "text"}, "test"\n)',
                "LibriSpeech is downloaded from the Hub: 16 train and 16 test Free Spoken Digit recordings of "
                "../shared/data with their words, " + FSDD_DECODED,
            ),
            (
                'dataset_sampling_rate = next(iter(raw_datasets.values())).features["audio"].sampling_rate',
                "dataset_sampling_rate = 16000  # decoded at 16 kHz",
                "the recordings are decoded at 16 kHz already (no `Audio` column: it would decode them with FFmpeg)",
            ),
            (
                "max_input_length = int(15.6 * feature_extractor.sampling_rate)\n"
                "min_input_length = int(2.0 * feature_extractor.sampling_rate)",
                "max_input_length = int(2.5 * feature_extractor.sampling_rate)\n"
                "min_input_length = int(0.1 * feature_extractor.sampling_rate)",
                "spoken digits last under 2.5 s, not LibriSpeech's 2 to 15.6 s: inputs padded to 2.5 s",
            ),
            ("num_proc=8", "num_proc=1", "one process, not 8, for a few dozen rows on a CPU"),
            ("dataloader_num_workers=16,", "dataloader_num_workers=0,", "no loader processes for a few dozen rows"),
            (
                "num_train_epochs=5.0,",
                "max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=2, "
                "per_device_eval_batch_size=1,",
                TRAIN_STEPS.format(2) + " of 2 micro-batches of 2 rows (its IPU config: 32); evaluation batches of 16 "
                "rows (1 x 4 device iterations x 4 replicas), not 128",
            ),
            (
                "with self.processor.as_target_processor():\n            labels_batch = self.processor.pad(",
                "if True:  # transformers 5 removed `as_target_processor()`\n"
                "            labels_batch = self.processor.tokenizer.pad(",
                "transformers 5 removed `as_target_processor()`, under which `processor.pad` padded the labels with "
                "the tokenizer: the tokenizer's `pad`",
            ),
        ),
    ),
]

PACKED_BERT_MODULES = (
    "`utils.packing.dataset_creator.PackedDatasetCreator`, `models.modeling_bert_packed.PipelinedPackedBert*` and "
    "`pipeline.packed_bert.PackedBert*Pipeline`"
)
PACKED_BERT_WHY = (
    "imports the modules that sit beside it in Optimum Graphcore's notebooks folder ({modules}: a forked BERT on "
    "poptorch), no part of `optimum.graphcore` and not vendored; its packing is `optimum_ipu.packing` here, for "
    "training (`prepare_packed_training`{labels}) and for inference (`{inference}`, each text's logits equal to the "
    "text alone)"
)
NOTEBOOKS += [
    Notebook(
        "packed_bert/packedBERT_single_label_text_classification.ipynb",
        NOT_RUN,
        PACKED_BERT_WHY.format(modules=PACKED_BERT_MODULES, labels="", inference="predict_packed_classification"),
    ),
    Notebook(
        "packed_bert/packedBERT_multi_label_text_classification.ipynb",
        NOT_RUN,
        PACKED_BERT_WHY.format(
            modules=PACKED_BERT_MODULES, labels=", with multi-hot `labels`", inference="predict_packed_classification"
        ),
    ),
    Notebook(
        "packed_bert/packedBERT_question_answering.ipynb",
        NOT_RUN,
        PACKED_BERT_WHY.format(
            modules=PACKED_BERT_MODULES.replace("PackedBert*Pipeline", "PackedBertQuestionAnsweringPipeline"),
            labels="",
            inference="predict_packed_question_answering",
        ),
    ),
    Notebook(
        "wav2vec2/wav2vec2-inference-checkpoint.ipynb",
        NOT_APPLICABLE,
        "drives poptorch itself (`import poptorch`, `ipu_config.to_options()`, `poptorch.inferenceModel(...)`, "
        "`.compile(...)`), Graphcore's SDK rather than Optimum Graphcore's API; here the same CTC transcription is "
        '`pipeline("automatic-speech-recognition", ...)`',
    ),
    Notebook(
        "mt5_xnli.ipynb",
        NOT_RUN,
        "its cells assert what the fine-tuned mT5-large answers (3-token sequences whose top 3 scores are the label "
        "tokens `▁0`, `▁1`, `▁2`), which no random stand-in can; its weights cannot be had offline",
    ),
    Notebook(
        "image_classification.ipynb",
        NOT_RUN,
        "its transforms are torchvision's (`RandomResizedCrop`, `ToTensor`, ...: its first cell installs it), which "
        "this project's environment does not install",
    ),
]

BY_PATH = {notebook.path: notebook for notebook in NOTEBOOKS}


def markdown_table() -> str:
    """The table of docs/migrating.md ("Notebooks"): every notebook, how it runs here, and why."""
    rows = ["| notebook | here | what runs, or why not |", "|---|---|---|"]
    for notebook in sorted(NOTEBOOKS, key=lambda n: n.path):
        rows.append(f"| `{notebook.path}` | {notebook.status} | {notebook.why} |")
    return "\n".join(rows)
