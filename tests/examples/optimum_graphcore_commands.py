# ruff: noqa: E501, W291 -- the commands are kept verbatim: long lines, trailing spaces and all
"""Optimum Graphcore's example commands, verbatim, for `test_optimum_graphcore_commands.py`.

Copied from the repository `huggingface/optimum-graphcore`:

- `README_COMMIT`: every complete command of its examples' `README.md` files (fragments that end in `...` are left
  out), and one command per example test of its `tests/test_examples.py`, as that file's `_create_command_line`
  builds and prints it (the first model of `MODELS_TO_TEST_MAPPING` the script supports, its temporary output folder
  written `/tmp/tmp_output`). Its `tests/examples/*.txt` are diffs of the scripts against `transformers`', not
  commands.
- `V0_5_0_COMMIT` (release v0.5.0, the last before `--pod_type` gave way to `--n_ipu`): the commands of its
  question-answering and summarization READMEs, which use `--pod_type`, `--predict_with_generate`,
  `--generation_num_beams` and the config field `sharded_execution_for_inference`.

A command is kept as the README shows it, shell line continuations and all (`Command.text`); `Command.argv()` reads it
as a shell would.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

REPOSITORY = "huggingface/optimum-graphcore"
README_COMMIT = "b8cd6e096a11139745d519aedea4a9414395f093"  # main, 2026-04-15
V0_5_0_COMMIT = "5e039b74e5de140e6a64aaaf0a7c62b8e9a826c0"  # tag v0.5.0


@dataclass(frozen=True)
class Command:
    """One command of Optimum Graphcore: `name` (`where:folder/script-n`), the file it comes from (`path` at
    `commit`) and its verbatim `text`."""

    name: str
    path: str
    commit: str
    text: str

    @property
    def script(self) -> str:
        """The script's file name, e.g. `run_qa.py`."""
        return next(word for word in self.words() if word.endswith(".py")).rsplit("/", 1)[-1]

    def words(self) -> list[str]:
        """The command as a shell splits it, with the variables its `export` lines set expanded."""
        variables: dict[str, str] = {}
        lines = []
        for line in self.text.replace("\\\n", " ").splitlines():
            exported = re.fullmatch(r"\s*export (\w+)=(\S*)\s*", line)
            if exported:
                variables[exported[1]] = exported[2]
            elif line.strip():
                lines.append(line)
        text = re.sub(r"\$(\w+)", lambda match: variables[match[1]], " ".join(lines))
        return shlex.split(text)

    def argv(self) -> list[str]:
        """The script's arguments: what follows the script's path."""
        words = self.words()
        return words[next(i for i, word in enumerate(words) if word.endswith(".py")) + 1 :]


COMMANDS: tuple[Command, ...] = (
    Command(
        "readme:audio-classification/run_audio_classification-1",
        "examples/audio-classification/README.md",
        README_COMMIT,
        r"""python examples/audio-classification/run_audio_classification.py \
    --model_name_or_path facebook/hubert-base-ls960 \
    --ipu_config_name Graphcore/hubert-base-ipu \
    --dataset_name superb \
    --dataset_config_name ks \
    --output_dir hubert-base-superb-ks \
    --overwrite_output_dir \
    --remove_unused_columns False \
    --do_train \
    --do_eval \
    --learning_rate 3e-5 \
    --max_length_seconds 1 \
    --attention_mask False \
    --warmup_ratio 0.1 \
    --lr_schedule linear \
    --weight_decay 0.01 \
    --num_train_epochs 5 \
    --per_device_train_batch_size 2 \
    --gradient_accumulation_steps 16 \
    --per_device_eval_batch_size 8 \
    --n_ipu 16 \
    --dataloader_num_workers 64 \
    --dataloader_drop_last True \
    --logging_strategy steps \
    --logging_steps 10 \
    --seed 0
""",
    ),
    Command(
        "readme:audio-classification/run_audio_classification-2",
        "examples/audio-classification/README.md",
        README_COMMIT,
        r"""python examples/audio-classification/run_audio_classification.py \
    --model_name_or_path facebook/hubert-base-ls960 \
    --ipu_config_name Graphcore/hubert-base-ipu \
    --dataset_name common_language \
    --audio_column_name audio \
    --label_column_name language \
    --output_dir /tmp/hubert-base-common-language \
    --overwrite_output_dir \
    --remove_unused_columns False \
    --do_train \
    --do_eval \
    --max_length_seconds 13 \
    --attention_mask False \
    --learning_rate 1e-4 \
    --warmup_ratio 0.25 \
    --lr_schedule linear \
    --num_train_epochs 10 \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 32 \
    --per_device_eval_batch_size 4 \
    --dataloader_num_workers 64 \
    --dataloader_drop_last True \
    --n_ipu 16 \
    --logging_strategy steps \
    --logging_steps 10 \
    --seed 0
""",
    ),
    Command(
        "readme:image-classification/run_image_classification-1",
        "examples/image-classification/README.md",
        README_COMMIT,
        r"""python examples/image-classification/run_image_classification.py \
    --dataset_name cifar10 \
    --output_dir ./cifar10_outputs/ \
    --overwrite_output_dir \
    --model_name_or_path google/vit-base-patch16-224-in21k \
    --ipu_config_name Graphcore/vit-base-ipu \
    --n_ipu 16 \
    --remove_unused_columns False \
    --do_train \
    --do_eval \
    --learning_rate 1e-4 \
    --lr_scheduler_type cosine \
    --weight_decay 0.0 \
    --warmup_ratio 0.25 \
    --loss_scaling 1.0 \
    --num_train_epochs 100 \
    --per_device_train_batch_size 17 \
    --per_device_eval_batch_size 17 \
    --gradient_accumulation_steps 128 \
    --logging_strategy steps \
    --logging_steps 10 \
    --save_total_limit 3 \
    --dataloader_mode async_rebatched \
    --dataloader_num_workers 200 \
    --dataloader_drop_last \
    --seed 1337
""",
    ),
    Command(
        "readme:image-classification/run_image_classification-2",
        "examples/image-classification/README.md",
        README_COMMIT,
        r"""python examples/image-classification/run_image_classification.py \
    --dataset_name beans \
    --output_dir ./beans_outputs/ \
    --model_name_or_path google/vit-base-patch16-224-in21k \
    --ipu_config_name Graphcore/vit-base-ipu \
    --remove_unused_columns False \
    --do_train \
    --do_eval \
    --learning_rate 3e-4 \
    --num_train_epochs 10 \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 1 \
    --gradient_accumulation_steps 16 \
    --n_ipu 16 \
    --logging_strategy steps \
    --logging_steps 10 \
    --save_total_limit 3 \
    --dataloader_num_workers 8 \
    --dataloader_drop_last \
    --seed 1337
""",
    ),
    Command(
        "readme:image-classification/run_image_classification-3",
        "examples/image-classification/README.md",
        README_COMMIT,
        r"""python examples/image-classification/run_image_classification.py \
    --dataset_name cats_vs_dogs \
    --output_dir ./cats_vs_dogs_outputs/ \
    --model_name_or_path google/vit-base-patch16-224-in21k \
    --ipu_config_name Graphcore/vit-base-ipu \
    --remove_unused_columns False \
    --do_train \
    --do_eval \
    --push_to_hub \
    --push_to_hub_model_id vit-base-cats-vs-dogs \
    --learning_rate 2e-4 \
    --num_train_epochs 5 \
    --per_device_train_batch_size 15 \
    --per_device_eval_batch_size 15 \
    --n_ipu 16 \
    --logging_strategy steps \
    --logging_steps 10 \
    --evaluation_strategy epoch \
    --save_strategy epoch \
    --load_best_model_at_end True \
    --save_total_limit 3 \
    --seed 1337
""",
    ),
    Command(
        "readme:image-classification/run_image_classification-4",
        "examples/image-classification/README.md",
        README_COMMIT,
        r"""python examples/image-classification/run_image_classification.py \
    --ipu_config_name Graphcore/vit-base-ipu \
    --train_dir <path-to-train-root> \
    --train_val_split 0.1 \
    --output_dir ./outputs/ \
    --do_train \
    --do_eval \
    --num_train_epochs 3 \
    --learning_rate 3e-4 \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 1 \
    --n_ipu 16 \
    --dataloader_num_workers 8 \
    --dataloader_drop_last \
    --seed 1337 \
    --remove_unused_columns False
""",
    ),
    Command(
        "readme:language-modeling/run_pretraining-1",
        "examples/language-modeling/README.md",
        README_COMMIT,
        r"""python examples/language-modeling/run_pretraining.py \
  --model_type groupbert \
  --tokenizer_name bert-base-uncased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --dataset_name Graphcore/wikipedia-bert-128 \
  --do_train \
  --logging_steps 5 \
  --max_seq_length 128 \
  --max_steps 10500 \
  --is_already_preprocessed \
  --dataloader_num_workers 64 \
  --dataloader_mode async_rebatched \
  --lamb \
  --per_device_train_batch_size 10 \
  --gradient_accumulation_steps 1640 \
  --n_ipu 16 \
  --learning_rate 0.012 \
  --loss_scaling 16384 \
  --weight_decay 0.01 \
  --warmup_ratio 0.14 \
  --groupbert_schedule \
  --config_overrides "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0,layer_norm_eps=0.001" \
  --ipu_config_overrides "device_iterations=1,matmul_proportion=0.22,layers_per_ipu=[1 3 4 4]" \
  --output_dir output-pretrain-groupbert-base-phase1
""",
    ),
    Command(
        "readme:language-modeling/run_pretraining-2",
        "examples/language-modeling/README.md",
        README_COMMIT,
        r"""examples/language-modeling/run_pretraining.py \
  --model_type groupbert \
  --tokenizer_name bert-base-uncased \
  --model_name_or_path ./output-pretrain-groupbert-base-phase1 \
  --ipu_config_name Graphcore/bert-base-ipu \
  --dataset_name Graphcore/wikipedia-bert-512 \
  --do_train \
  --logging_steps 5 \
  --max_seq_length 512 \
  --max_steps 2038 \
  --is_already_preprocessed \
  --dataloader_num_workers 64 \
  --dataloader_mode async_rebatched \
  --lamb \
  --per_device_train_batch_size 2 \
  --gradient_accumulation_steps 2048 \
  --n_ipu 16 \
  --learning_rate 0.01 \
  --loss_scaling 128.0 \
  --weight_decay 0.01 \
  --warmup_ratio 0.13 \
  --groupbert_schedule \
  --config_overrides "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0,layer_norm_eps=0.001" \
  --ipu_config_overrides device_iterations=1,embedding_serialization_factor=2,matmul_proportion=0.22 \
  --output_dir output-pretrain-groupbert-base-phase2
""",
    ),
    Command(
        "readme:language-modeling/run_pretraining-3",
        "examples/language-modeling/README.md",
        README_COMMIT,
        r"""python examples/language-modeling/run_pretraining.py \
  --config_name bert-base-uncased \
  --tokenizer_name bert-base-uncased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --dataset_name Graphcore/wikipedia-bert-128 \
  --do_train \
  --logging_steps 5 \
  --max_seq_length 128 \
  --max_steps 10500 \
  --is_already_preprocessed \
  --dataloader_num_workers 64 \
  --dataloader_mode async_rebatched \
  --lamb \
  --lamb_no_bias_correction \
  --per_device_train_batch_size 32 \
  --gradient_accumulation_steps 512 \
  --n_ipu 16 \
  --learning_rate 0.006 \
  --lr_scheduler_type linear \
  --loss_scaling 16384 \
  --weight_decay 0.01 \
  --warmup_ratio 0.28 \
  --config_overrides "layer_norm_eps=0.001" \
  --ipu_config_overrides "device_iterations=1" \
  --output_dir output-pretrain-bert-base-phase1
""",
    ),
    Command(
        "readme:language-modeling/run_pretraining-4",
        "examples/language-modeling/README.md",
        README_COMMIT,
        r"""python examples/language-modeling/run_pretraining.py \
  --config_name bert-base-uncased \
  --tokenizer_name bert-base-uncased \
  --model_name_or_path ./output-pretrain-bert-base-phase1 \
  --ipu_config_name Graphcore/bert-base-ipu \
  --dataset_name Graphcore/wikipedia-bert-512 \
  --do_train \
  --logging_steps 5 \
  --max_seq_length 512 \
  --max_steps 2038 \
  --is_already_preprocessed \
  --dataloader_num_workers 128 \
  --dataloader_mode async_rebatched \
  --lamb \
  --lamb_no_bias_correction \
  --per_device_train_batch_size 8 \
  --gradient_accumulation_steps 512 \
  --n_ipu 16 \
  --learning_rate 0.002828 \
  --lr_scheduler_type linear \
  --loss_scaling 128.0 \
  --weight_decay 0.01 \
  --warmup_ratio 0.128 \
  --config_overrides "layer_norm_eps=0.001" \
  --ipu_config_overrides "device_iterations=1,embedding_serialization_factor=2,matmul_proportion=0.22" \
  --output_dir output-pretrain-bert-base-phase2
""",
    ),
    Command(
        "readme:language-modeling/run_pretraining-5",
        "examples/language-modeling/README.md",
        README_COMMIT,
        r"""python examples/language-modeling/run_pretraining.py \
  --config_name bert-large-uncased \
  --tokenizer_name bert-large-uncased \
  --ipu_config_name Graphcore/bert-large-ipu \
  --dataset_name Graphcore/wikipedia-bert-128 \
  --do_train \
  --logging_steps 5 \
  --max_seq_length 128 \
  --max_steps 10500 \
  --is_already_preprocessed \
  --dataloader_num_workers 64 \
  --dataloader_mode async_rebatched \
  --lamb \
  --lamb_no_bias_correction \
  --per_device_train_batch_size 8 \
  --gradient_accumulation_steps 2048 \
  --n_ipu 16 \
  --learning_rate 0.006 \
  --lr_scheduler_type linear \
  --loss_scaling 32768 \
  --weight_decay 0.01 \
  --warmup_ratio 0.28 \
  --config_overrides "layer_norm_eps=0.001" \
  --ipu_config_overrides "matmul_proportion=[0.14 0.19 0.19 0.19]" \
  --output_dir output-pretrain-bert-large-phase1
""",
    ),
    Command(
        "readme:language-modeling/run_pretraining-6",
        "examples/language-modeling/README.md",
        README_COMMIT,
        r"""python examples/language-modeling/run_pretraining.py \
  --config_name bert-large-uncased \
  --tokenizer_name bert-large-uncased \
  --model_name_or_path ./output-pretrain-bert-large-phase1 \
  --ipu_config_name Graphcore/bert-large-ipu \
  --dataset_name Graphcore/wikipedia-bert-512 \
  --do_train \
  --logging_steps 5 \
  --max_seq_length 512 \
  --max_steps 2038 \
  --is_already_preprocessed \
  --dataloader_num_workers 96 \
  --dataloader_mode async_rebatched \
  --lamb \
  --lamb_no_bias_correction \
  --per_device_train_batch_size 2 \
  --gradient_accumulation_steps 2048 \
  --n_ipu 16 \
  --learning_rate 0.002828 \
  --lr_scheduler_type linear \
  --loss_scaling 16384 \
  --weight_decay 0.01 \
  --warmup_ratio 0.128 \
  --config_overrides "layer_norm_eps=0.001" \
  --ipu_config_overrides "matmul_proportion=[0.14 0.19 0.19 0.19]" \
  --output_dir output-pretrain-bert-large-phase2
""",
    ),
    Command(
        "readme:language-modeling/run_mlm-1",
        "examples/language-modeling/README.md",
        README_COMMIT,
        r"""python examples/language-modeling/run_mlm.py \
    --model_name_or_path roberta-base  \
    --ipu_config_name Graphcore/roberta-base-ipu \
    --dataset_name wikitext \
    --dataset_config_name wikitext-2-raw-v1 \
    --per_device_train_batch_size 4 \
    --per_device_eval_batch_size 1 \
    --gradient_accumulation_steps 16 \
    --do_train \
    --do_eval \
    --num_train_epochs 5 \
    --n_ipu 16 \
    --output_dir /tmp/mlm_output \
    --ipu_config_overrides="inference_device_iterations=5" \
    --dataloader_drop_last
""",
    ),
    Command(
        "readme:language-modeling/run_clm-1",
        "examples/language-modeling/README.md",
        README_COMMIT,
        r"""python examples/language-modeling/run_clm.py \
    --model_name_or_path gpt2 \
    --ipu_config_name Graphcore/gpt2-small-ipu \
    --dataset_name wikitext \
    --dataset_config_name wikitext-2-raw-v1 \
    --do_train \
    --do_eval \
    --num_train_epochs 30 \
    --dataloader_num_workers 64 \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 1 \
    --gradient_accumulation_steps 128 \
    --output_dir /tmp/clm_gpt2 \
    --logging_steps 1 \
    --learning_rate 1e-5 \
    --lr_scheduler_type linear \
    --loss_scaling 16384 \
    --weight_decay 0.01 \
    --warmup_ratio 0.1 \
    --config_overrides="activation_function=gelu" \
    --dataloader_drop_last \
    --n_ipu 16
""",
    ),
    Command(
        "readme:language-modeling/run_clm-2",
        "examples/language-modeling/README.md",
        README_COMMIT,
        r"""python examples/language-modeling/run_clm.py \
    --model_name_or_path gpt2-medium \
    --ipu_config_name Graphcore/gpt2-medium-ipu \
    --dataset_name wikitext \
    --dataset_config_name wikitext-2-raw-v1 \
    --do_train \
    --do_eval \
    --num_train_epochs 30 \
    --dataloader_num_workers 64 \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 1 \
    --gradient_accumulation_steps 256 \
    --output_dir /tmp/clm_gpt2_medium \
    --logging_steps 1 \
    --learning_rate 1e-5 \
    --lr_scheduler_type linear \
    --loss_scaling 16384 \
    --weight_decay 0.01 \
    --warmup_ratio 0.1 \
    --config_overrides="activation_function=gelu" \
    --dataloader_drop_last \
    --n_ipu 16

""",
    ),
    Command(
        "readme:multiple-choice/run_swag-1",
        "examples/multiple-choice/README.md",
        README_COMMIT,
        r"""python examples/multiple-choice/run_swag.py \
--model_name_or_path roberta-base \
--ipu_config_name Graphcore/roberta-base-ipu \
--do_train \
--do_eval \
--learning_rate 5e-5 \
--num_train_epochs 3 \
--output_dir ./output/swag_base \
--per_device_eval_batch_size=2 \
--per_device_train_batch_size=2 \
--gradient_accumulation_steps 16 \
--n_ipu 16 \
--report_to none \
--pad_on_batch_axis \
--overwrite_output
""",
    ),
    Command(
        "readme:question-answering/run_qa-1",
        "examples/question-answering/README.md",
        README_COMMIT,
        r"""python examples/question-answering/run_qa.py \
  --model_name_or_path Graphcore/bert-base-uncased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --dataset_name squad \
  --do_train \
  --do_eval \
  --num_train_epochs 3 \
  --per_device_train_batch_size 2 \
  --per_device_eval_batch_size 16 \
  --gradient_accumulation_steps 16 \
  --n_ipu 16 \
  --learning_rate 7e-5 \
  --max_seq_length 384 \
  --doc_stride 128 \
  --seed 42 \
  --lr_scheduler_type linear \
  --loss_scaling 64 \
  --weight_decay 0.01 \
  --warmup_ratio 0.1 \
  --logging_steps 1 \
  --save_steps -1 \
  --dataloader_num_workers 64 \
  --pad_on_batch_axis \
  --output_dir ./output/squad_bert_base \
  --overwrite_output_dir
""",
    ),
    Command(
        "readme:question-answering/run_vqa-1",
        "examples/question-answering/README.md",
        README_COMMIT,
        r"""python examples/question-answering/run_vqa.py \
  --model_name_or_path unc-nlp/lxmert-base-uncased \
  --ipu_config_name Graphcore/lxmert-base-ipu \
  --dataset_name Graphcore/gqa-lxmert \
  --do_train \
  --do_eval \
  --max_seq_length 512 \
  --per_device_train_batch_size 1 \
  --num_train_epochs 4 \
  --dataloader_num_workers 64 \
  --logging_steps 5 \
  --learning_rate 1e-5 \
  --lr_scheduler_type linear \
  --loss_scaling 16384 \
  --weight_decay 0.01 \
  --warmup_ratio 0.1 \
  --output_dir /tmp/gqa/ \
  --dataloader_drop_last \
  --replace_qa_head \
  --n_ipu 16
""",
    ),
    Command(
        "readme:speech-pretraining/run_pretraining-1",
        "examples/speech-pretraining/README.md",
        README_COMMIT,
        r"""python run_pretraining.py \
	--model_name_or_path "facebook/wav2vec2-base" \
	--dataset_name "librispeech_asr" \
	--dataset_config_name "clean" \
	--train_split_name "validation" \
	--ipu_config_name "Graphcore/wav2vec2-base-ipu" \
	--output_dir "./wav2vec2-pretrained-demo" \
	--max_duration_in_seconds 15.6 \
	--min_duration_in_seconds 2.0 \
	--do_train \
	--overwrite_output_dir \
	--layerdrop 0.05 \
	--per_device_train_batch_size 1 \
	--dataloader_mode "async_rebatched" \
	--dataloader_num_workers 64 \
	--num_train_epochs 1 \
	--warmup_steps 1000 \
	--weight_decay 0.01 \
	--learning_rate 0.001 \
	--adam_beta1 0.9 \
	--adam_beta2 0.98 \
	--adam_epsilon 1e-04 \
	--max_gumbel_temperature 2.0 \
	--min_gumbel_temperature 0.5 \
	--gumbel_temperature_decay 0.999995 \
	--logging_steps 10 \
	--n_ipu 16
""",
    ),
    Command(
        "readme:speech-pretraining/run_pretraining-2",
        "examples/speech-pretraining/README.md",
        README_COMMIT,
        r"""python run_pretraining.py \
	--model_name_or_path "facebook/wav2vec2-base" \
	--dataset_name "librispeech_asr" \
	--dataset_config_name "clean" \
	--train_split_name "train.100" \
	--ipu_config_name "Graphcore/wav2vec2-base-ipu" \
	--output_dir "./wav2vec2-pretrained-base" \
	--max_duration_in_seconds 15.6 \
	--min_duration_in_seconds 2.0 \
	--do_train \
	--overwrite_output_dir \
	--layerdrop 0.05 \
	--per_device_train_batch_size 1 \
	--dataloader_mode "async_rebatched" \
	--dataloader_num_workers 64 \
	--num_train_epochs 10 \
	--warmup_steps 1000 \
	--weight_decay 0.01 \
	--learning_rate 0.001 \
	--adam_beta1 0.9 \
	--adam_beta2 0.98 \
	--adam_epsilon 1e-04 \
	--max_gumbel_temperature 2.0 \
	--min_gumbel_temperature 0.5 \
	--gumbel_temperature_decay 0.999995 \
	--logging_steps 10 \
	--n_ipu 16
""",
    ),
    Command(
        "readme:speech-pretraining/run_pretraining-3",
        "examples/speech-pretraining/README.md",
        README_COMMIT,
        r"""python run_pretraining.py \
	--model_name_or_path "facebook/wav2vec2-large-960h" \
	--dataset_name "librispeech_asr" \
	--dataset_config_name "clean" \
	--train_split_name "train.100" \
	--ipu_config_name "Graphcore/wav2vec2-large-ipu" \
	--output_dir "./wav2vec2-pretrained-large" \
	--max_duration_in_seconds 15.6 \
	--min_duration_in_seconds 2.0 \
	--do_train \
	--overwrite_output_dir \
	--layerdrop 0.05 \
	--per_device_train_batch_size 1 \
	--dataloader_num_workers 64 \
	--num_train_epochs 10 \
	--warmup_steps 1000 \
	--weight_decay 0.01 \
	--learning_rate 0.001 \
	--adam_beta1 0.9 \
	--adam_beta2 0.98 \
	--adam_epsilon 1e-04 \
	--max_gumbel_temperature 2.0 \
	--min_gumbel_temperature 0.5 \
	--gumbel_temperature_decay 0.999995 \
	--logging_steps 10 \
	--n_ipu 16
""",
    ),
    Command(
        "readme:speech-recognition/run_speech_recognition_ctc-1",
        "examples/speech-recognition/README.md",
        README_COMMIT,
        r"""python run_speech_recognition_ctc.py \
    --dataset_name "librispeech_asr" \
    --dataset_config_name "clean" \
    --train_split_name "train.100" \
    --eval_split_name "validation" \
    --model_name_or_path "facebook/wav2vec2-base-960h" \
    --ipu_config_name "Graphcore/wav2vec2-ctc-base-ipu" \
    --mask_time_prob 0.0 \
    --output_dir "./wav2vec2-base-960h" \
    --overwrite_output_dir \
    --length_column_name "input_length" \
    --num_train_epochs 5 \
    --learning_rate "3e-4" \
    --warmup_steps 400 \
    --evaluation_strategy "steps" \
    --text_column_name "text" \
    --save_steps 400 \
    --eval_steps 400 \
    --logging_steps 10 \
    --save_total_limit 1 \
    --freeze_feature_encoder \
    --do_train \
    --do_eval \
    --layerdrop 0.0 \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 1 \
    --adam_beta1 0.9 \
    --adam_beta2 0.98 \
    --adam_epsilon 0.0001 \
    --dataloader_drop_last \
    --dataloader_mode "async_rebatched" \
    --dataloader_num_workers 8 
""",
    ),
    Command(
        "readme:speech-recognition/run_speech_recognition_ctc-2",
        "examples/speech-recognition/README.md",
        README_COMMIT,
        r"""python run_speech_recognition_ctc.py \
    --dataset_name "librispeech_asr" \
    --dataset_config_name "clean" \
    --train_split_name "train.100" \
    --eval_split_name "validation" \
    --model_name_or_path "facebook/wav2vec2-large-960h" \
    --ipu_config_name "Graphcore/wav2vec2-ctc-large-ipu" \
    --mask_time_prob 0.0 \
    --output_dir "./wav2vec2-large-960h" \
    --overwrite_output_dir \
    --length_column_name "input_length" \
    --num_train_epochs 5 \
    --learning_rate "3e-4" \
    --warmup_steps 400 \
    --evaluation_strategy "steps" \
    --text_column_name "text" \
    --save_steps 400 \
    --eval_steps 400 \
    --logging_steps 10 \
    --save_total_limit 1 \
    --freeze_feature_encoder \
    --do_train \
    --do_eval \
    --layerdrop 0.0 \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 1 \
    --adam_beta1 0.9 \
    --adam_beta2 0.98 \
    --adam_epsilon 0.0001 \
    --dataloader_drop_last \
    --dataloader_mode "async_rebatched" \
    --dataloader_num_workers 8 
""",
    ),
    Command(
        "readme:summarization/run_summarization-1",
        "examples/summarization/README.md",
        README_COMMIT,
        r"""python examples/summarization/run_summarization.py \
    --model_name_or_path t5-small \
    --ipu_config_name Graphcore/t5-small-ipu \
    --ipu_config_overrides "inference_device_iterations=1,inference_replication_factor=2,execute_encoder_on_cpu_for_generation=False" \
    --do_train \
    --do_eval \
    --dataset_name cnn_dailymail \
    --dataset_config "3.0.0" \
    --source_prefix "summarize: " \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 4 \
    --n_ipu 16 \
    --num_train_epochs 2 \
    --max_target_length 200 \
    --logging_steps 1 \
    --learning_rate 1e-4 \
    --lr_scheduler_type constant \
    --max_grad_norm 0.5 \
    --pad_to_max_length \
    --dataloader_drop_last \
    --output_dir /tmp/t5-summarization \
    --overwrite_output_dir
""",
    ),
    Command(
        "readme:summarization/run_summarization-2",
        "examples/summarization/README.md",
        README_COMMIT,
        r"""python examples/summarization/run_summarization.py \
    --model_name_or_path t5-small \
    --ipu_config_name Graphcore/t5-small-ipu \
    --do_train \
    --do_eval \
    --train_file path_to_csv_or_jsonlines_file \
    --validation_file path_to_csv_or_jsonlines_file \
    --source_prefix "summarize: " \
    --overwrite_output_dir \
    --per_device_train_batch_size=1 \
    --per_device_eval_batch_size=4 \
    --max_target_length 200 \
    --num_train_epochs 2 \
    --n_ipu 16 \
    --learning_rate 1e-4 \
    --lr_scheduler_type constant \
    --max_grad_norm 0.5 \
    --pad_to_max_length \
    --dataloader_drop_last \
    --output_dir /tmp/t5-summarization \
""",
    ),
    Command(
        "readme:summarization/run_summarization-3",
        "examples/summarization/README.md",
        README_COMMIT,
        r"""python examples/summarization/run_summarization.py \
    --model_name_or_path facebook/bart-base \
    --ipu_config_name Graphcore/bart-base-ipu \
    --ipu_config_overrides "inference_device_iterations=1,inference_replication_factor=2,execute_encoder_on_cpu_for_generation=False,layers_per_ipu=[0 4 4 4]" \
    --do_train True \
    --do_eval True \
    --dataset_name cnn_dailymail \
    --dataset_config "3.0.0" \
    --per_device_train_batch_size 2 \
    --per_device_eval_batch_size 4 \
    --n_ipu 16 \
    --num_train_epochs 2 \
    --logging_steps 1 \
    --learning_rate 1e-4 \
    --lr_scheduler_type constant \
    --max_grad_norm 0.5 \
    --pad_to_max_length \
    --dataloader_drop_last \
    --output_dir /tmp/bart-summarization \
    --overwrite_output_dir
""",
    ),
    Command(
        "readme:text-classification/run_glue-1",
        "examples/text-classification/README.md",
        README_COMMIT,
        r"""export TASK_NAME=sst2

python run_glue.py \
  --model_name_or_path bert-base-cased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --task_name $TASK_NAME \
  --do_train \
  --do_eval \
  --max_seq_length 128 \
  --per_device_train_batch_size 8 \
  --learning_rate 2e-5 \
  --num_train_epochs 3 \
  --output_dir ./output/$TASK_NAME/
""",
    ),
    Command(
        "readme:text-classification/run_glue-2",
        "examples/text-classification/README.md",
        README_COMMIT,
        r"""python run_glue.py \
  --model_name_or_path bert-base-cased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --dataset_name imdb  \
  --do_train \
  --do_predict \
  --max_seq_length 128 \
  --per_device_train_batch_size 32 \
  --n_ipu 16 \
  --learning_rate 2e-5 \
  --num_train_epochs 3 \
  --output_dir ./output/imdb/
""",
    ),
    Command(
        "readme:text-classification/run_xnli-1",
        "examples/text-classification/README.md",
        README_COMMIT,
        r"""python run_xnli.py \
  --model_name_or_path bert-base-multilingual-cased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --language de \
  --train_language en \
  --do_train \
  --do_eval \
  --per_device_train_batch_size 32 \
  --n_ipu 16 \
  --learning_rate 5e-5 \
  --num_train_epochs 2.0 \
  --max_seq_length 128 \
  --output_dir ./output/xnli/ \
  --save_steps -1
""",
    ),
    Command(
        "readme:token-classification/run_ner-1",
        "examples/token-classification/README.md",
        README_COMMIT,
        r"""python run_ner.py \
  --model_name_or_path bert-base-uncased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --dataset_name conll2003 \
  --n_ipu 16 \
  --output_dir ./output/test-ner \
  --do_train \
  --do_eval
""",
    ),
    Command(
        "readme:token-classification/run_ner-2",
        "examples/token-classification/README.md",
        README_COMMIT,
        r"""python run_ner.py \
  --model_name_or_path bert-base-uncased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --train_file path_to_train_file \
  --validation_file path_to_validation_file \
  --n_ipu 16 \
  --output_dir ./output/test-ner \
  --do_train \
  --do_eval
""",
    ),
    Command(
        "readme:translation/run_translation-1",
        "examples/translation/README.md",
        README_COMMIT,
        r"""python examples/translation/run_translation.py \
    --model_name_or_path facebook/bart-base \
    --ipu_config_name Graphcore/bart-base-ipu \
    --do_train \
    --do_eval \
    --source_lang en \
    --target_lang ro \
    --dataset_name wmt16 \
    --dataset_config_name ro-en \
    --output_dir /tmp/tst-translation \
    --per_device_train_batch_size=1 \
    --per_device_eval_batch_size=1 \
    --n_ipu 16 \
    --dataloader_drop_last \
    --pad_to_max_length \
    --logging_steps 1 \
    --overwrite_output_dir
""",
    ),
    Command(
        "readme:translation/run_translation-2",
        "examples/translation/README.md",
        README_COMMIT,
        r"""python examples/translation/run_translation.py \
    --model_name_or_path t5-small \
    --ipu_config_name Graphcore/t5-small-ipu \
    --do_train \
    --do_eval \
    --source_lang en \
    --target_lang ro \
    --source_prefix "translate English to Romanian: " \
    --dataset_name wmt16 \
    --dataset_config_name ro-en \
    --output_dir /tmp/tst-translation \
    --per_device_train_batch_size=2 \
    --per_device_eval_batch_size=2 \
    --n_ipu 16 \
    --dataloader_drop_last \
    --max_source_length 512 \
    --max_target_length 512 \
    --pad_to_max_length \
    --logging_steps 1 \
    --overwrite_output_dir
""",
    ),
    Command(
        "readme:translation/run_translation-3",
        "examples/translation/README.md",
        README_COMMIT,
        r"""python examples/translation/run_translation.py \
    --model_name_or_path t5-small \
    --ipu_config_name Graphcore/t5-small-ipu \
    --do_train \
    --do_eval \
    --source_lang en \
    --target_lang ro \
    --source_prefix "translate English to Romanian: " \
    --dataset_name wmt16 \
    --dataset_config_name ro-en \
    --train_file path_to_jsonlines_file \
    --validation_file path_to_jsonlines_file \
    --output_dir /tmp/tst-translation \
    --per_device_train_batch_size=2 \
    --per_device_eval_batch_size=2 \
    --n_ipu 16 \
    --dataloader_drop_last \
    --max_source_length 512 \
    --max_target_length 512 \
    --pad_to_max_length \
    --logging_steps 1 \
    --overwrite_output_dir
""",
    ),
    Command(
        "readme:translation/run_translation-4",
        "examples/translation/README.md",
        README_COMMIT,
        r"""python examples/translation/run_translation.py \
    --model_name_or_path t5-small \
    --ipu_config_name Graphcore/t5-small-ipu \
    --do_train \
    --do_eval \
    --source_lang en \
    --target_lang de \
    --source_prefix "translate English to German: " \
    --dataset_name stas/wmt14-en-de-pre-processed \
    --output_dir /tmp/tst-translation \
    --per_device_train_batch_size=2 \
    --per_device_eval_batch_size=2 \
    --n_ipu 16 \
    --dataloader_drop_last \
    --max_source_length 512 \
    --max_target_length 512 \
    --pad_to_max_length \
    --logging_steps 1 \
    --overwrite_output_dir
""",
    ),
    Command(
        "v0_5_0:question-answering/run_qa-1",
        "examples/question-answering/README.md",
        V0_5_0_COMMIT,
        r"""python examples/question-answering/run_qa.py \
  --model_name_or_path Graphcore/bert-base-uncased \
  --ipu_config_name Graphcore/bert-base-ipu \
  --dataset_name squad \
  --do_train \
  --do_eval \
  --num_train_epochs 3 \
  --per_device_train_batch_size 2 \
  --per_device_eval_batch_size 16 \
  --gradient_accumulation_steps 16 \
  --pod_type pod16 \
  --learning_rate 7e-5 \
  --max_seq_length 384 \
  --doc_stride 128 \
  --seed 42 \
  --lr_scheduler_type linear \
  --loss_scaling 64 \
  --weight_decay 0.01 \
  --warmup_ratio 0.1 \
  --logging_steps 1 \
  --save_steps -1 \
  --dataloader_num_workers 64 \
  --pad_on_batch_axis \
  --output_dir ./output/squad_bert_base \
  --overwrite_output_dir
""",
    ),
    Command(
        "v0_5_0:question-answering/run_vqa-1",
        "examples/question-answering/README.md",
        V0_5_0_COMMIT,
        r"""python examples/question-answering/run_vqa.py \
  --model_name_or_path unc-nlp/lxmert-base-uncased \
  --ipu_config_name Graphcore/lxmert-base-ipu \
  --dataset_name Graphcore/gqa-lxmert \
  --do_train \
  --do_eval \
  --max_seq_length 512 \
  --per_device_train_batch_size 1 \
  --num_train_epochs 4 \
  --dataloader_num_workers 64 \
  --logging_steps 5 \
  --learning_rate 1e-5 \
  --lr_scheduler_type linear \
  --loss_scaling 16384 \
  --weight_decay 0.01 \
  --warmup_ratio 0.1 \
  --output_dir /tmp/gqa/ \
  --dataloader_drop_last \
  --replace_qa_head \
  --pod_type pod16
""",
    ),
    Command(
        "v0_5_0:summarization/run_summarization-1",
        "examples/summarization/README.md",
        V0_5_0_COMMIT,
        r"""python examples/summarization/run_summarization.py \
    --model_name_or_path t5-small \
    --ipu_config_name Graphcore/t5-small-ipu \
    --ipu_config_overrides "inference_device_iterations=1,inference_replication_factor=2,sharded_execution_for_inference=True,execute_encoder_on_cpu_for_generation=False" \
    --do_train \
    --do_eval \
    --dataset_name cnn_dailymail \
    --dataset_config "3.0.0" \
    --source_prefix "summarize: " \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 4 \
    --pod_type pod16 \
    --num_train_epochs 2 \
    --max_target_length 200 \
    --logging_steps 1 \
    --learning_rate 1e-4 \
    --lr_scheduler_type constant \
    --max_grad_norm 0.5 \
    --pad_to_max_length \
    --dataloader_drop_last \
    --predict_with_generate \
    --generation_num_beams 2 \
    --output_dir /tmp/t5-summarization \
    --overwrite_output_dir
""",
    ),
    Command(
        "v0_5_0:summarization/run_summarization-2",
        "examples/summarization/README.md",
        V0_5_0_COMMIT,
        r"""python examples/summarization/run_summarization.py \
    --model_name_or_path t5-small \
    --ipu_config_name Graphcore/t5-small-ipu \
    --do_train \
    --do_eval \
    --train_file path_to_csv_or_jsonlines_file \
    --validation_file path_to_csv_or_jsonlines_file \
    --source_prefix "summarize: " \
    --overwrite_output_dir \
    --per_device_train_batch_size=1 \
    --per_device_eval_batch_size=4 \
    --max_target_length 200 \
    --num_train_epochs 2 \
    --pod_type pod16 \
    --learning_rate 1e-4 \
    --lr_scheduler_type constant \
    --max_grad_norm 0.5 \
    --pad_to_max_length \
    --dataloader_drop_last \
    --predict_with_generate \
    --generation_num_beams 2 \
    --output_dir /tmp/t5-summarization \
""",
    ),
    Command(
        "v0_5_0:summarization/run_summarization-3",
        "examples/summarization/README.md",
        V0_5_0_COMMIT,
        r"""python examples/summarization/run_summarization.py \
    --model_name_or_path facebook/bart-base \
    --ipu_config_name Graphcore/bart-base-ipu \
    --ipu_config_overrides "inference_device_iterations=1,inference_replication_factor=2,sharded_execution_for_inference=True,execute_encoder_on_cpu_for_generation=False,layers_per_ipu=[0 4 4 4]" \
    --do_train True \
    --do_eval True \
    --dataset_name cnn_dailymail \
    --dataset_config "3.0.0" \
    --per_device_train_batch_size 2 \
    --per_device_eval_batch_size 4 \
    --pod_type pod16 \
    --num_train_epochs 2 \
    --logging_steps 1 \
    --learning_rate 1e-4 \
    --lr_scheduler_type constant \
    --max_grad_norm 0.5 \
    --pad_to_max_length \
    --dataloader_drop_last \
    --predict_with_generate \
    --generation_num_beams 2 \
    --output_dir /tmp/bart-summarization \
    --overwrite_output_dir
""",
    ),
    Command(
        "tests:run_glue",
        "tests/test_examples.py",
        README_COMMIT,
        r"""python examples/text-classification/run_glue.py --model_name_or_path bert-base-uncased --ipu_config_name Graphcore/bert-base-ipu --task_name sst2 --do_train --do_eval --output_dir /tmp/tmp_output --overwrite_output_dir true --learning_rate 0.0001 --per_device_train_batch_size 2 --per_device_eval_batch_size 2 --save_strategy epoch --ipu_config_overrides executable_cache_dir=disabled,device_iterations=1,inference_device_iterations=5,gradient_accumulation_steps=64 --num_train_epochs 1 --max_steps -1 --dataloader_num_workers 16 --pad_on_batch_axis --save_steps -1 --save_total_limit 1 --report_to none --n_ipu 8 --loss_scaling 1024""",
    ),
    Command(
        "tests:run_ner",
        "tests/test_examples.py",
        README_COMMIT,
        r"""python examples/token-classification/run_ner.py --model_name_or_path bert-base-uncased --ipu_config_name Graphcore/bert-base-ipu --dataset_name conll2003 --do_train --do_eval --output_dir /tmp/tmp_output --overwrite_output_dir true --learning_rate 0.0001 --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --save_strategy epoch --ipu_config_overrides executable_cache_dir=disabled,device_iterations=1,inference_device_iterations=4,gradient_accumulation_steps=64 --num_train_epochs 1 --max_steps -1 --dataloader_num_workers 16 --pad_on_batch_axis --save_steps -1 --save_total_limit 1 --report_to none --n_ipu 8 --preprocessing_num_workers 16""",
    ),
    Command(
        "tests:run_swag",
        "tests/test_examples.py",
        README_COMMIT,
        r"""python examples/multiple-choice/run_swag.py --model_name_or_path bert-base-uncased --ipu_config_name Graphcore/bert-base-ipu --do_train --do_eval --output_dir /tmp/tmp_output --overwrite_output_dir true --learning_rate 0.0001 --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --save_strategy epoch --ipu_config_overrides executable_cache_dir=disabled,device_iterations=1,inference_device_iterations=4,gradient_accumulation_steps=64 --num_train_epochs 1 --max_steps -1 --dataloader_num_workers 16 --pad_on_batch_axis --save_steps -1 --save_total_limit 1 --report_to none --n_ipu 8 --preprocessing_num_workers 16""",
    ),
    Command(
        "tests:run_qa",
        "tests/test_examples.py",
        README_COMMIT,
        r"""python examples/question-answering/run_qa.py --model_name_or_path bert-base-uncased --ipu_config_name Graphcore/bert-base-ipu --dataset_name squad --do_train --do_eval --output_dir /tmp/tmp_output --overwrite_output_dir true --learning_rate 0.0001 --per_device_train_batch_size 2 --per_device_eval_batch_size 2 --save_strategy epoch --ipu_config_overrides executable_cache_dir=disabled,device_iterations=1,inference_device_iterations=4,gradient_accumulation_steps=64 --num_train_epochs 1 --max_steps -1 --dataloader_num_workers 16 --pad_on_batch_axis --save_steps -1 --save_total_limit 1 --report_to none --n_ipu 8 --preprocessing_num_workers 16""",
    ),
    Command(
        "tests:run_summarization",
        "tests/test_examples.py",
        README_COMMIT,
        r"""python examples/summarization/run_summarization.py --model_name_or_path t5-small --ipu_config_name Graphcore/t5-small-ipu --dataset_name cnn_dailymail --do_train --output_dir /tmp/tmp_output --overwrite_output_dir true --learning_rate 0.0001 --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --save_strategy epoch --ipu_config_overrides executable_cache_dir=disabled,device_iterations=1,inference_device_iterations=6,gradient_accumulation_steps=64 --num_train_epochs 2 --max_steps -1 --dataloader_num_workers 16 --pad_on_batch_axis --save_steps -1 --save_total_limit 1 --report_to none --n_ipu 8 --dataset_config 3.0.0 --prediction_loss_only --pad_to_max_length --max_target_length 200 --max_source_length 1024 --preprocessing_num_workers 16 --source_prefix 'summarize: '""",
    ),
    Command(
        "tests:run_translation",
        "tests/test_examples.py",
        README_COMMIT,
        r"""python examples/translation/run_translation.py --model_name_or_path t5-small --ipu_config_name Graphcore/t5-small-ipu --dataset_name wmt16 --do_train --output_dir /tmp/tmp_output --overwrite_output_dir true --learning_rate 0.0001 --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --save_strategy epoch --ipu_config_overrides executable_cache_dir=disabled,device_iterations=1,inference_device_iterations=6,gradient_accumulation_steps=64 --num_train_epochs 2 --max_steps -1 --dataloader_num_workers 16 --pad_on_batch_axis --save_steps -1 --save_total_limit 1 --report_to none --n_ipu 8 --dataset_config ro-en --source_lang ro --target_lang en --pad_to_max_length --max_source_length 512 --max_target_length 512 --prediction_loss_only --preprocessing_num_workers 16 --source_prefix 'translate English to Romanian: '""",
    ),
    Command(
        "tests:run_image_classification",
        "tests/test_examples.py",
        README_COMMIT,
        r"""python examples/image-classification/run_image_classification.py --model_name_or_path google/vit-base-patch16-224-in21k --ipu_config_name Graphcore/vit-base-ipu --dataset_name cifar10 --do_train --do_eval --output_dir /tmp/tmp_output --overwrite_output_dir true --learning_rate 0.0001 --per_device_train_batch_size 2 --per_device_eval_batch_size 2 --save_strategy epoch --ipu_config_overrides executable_cache_dir=disabled,device_iterations=1,inference_device_iterations=4,gradient_accumulation_steps=64 --num_train_epochs 2 --max_steps -1 --dataloader_num_workers 16 --pad_on_batch_axis --save_steps -1 --save_total_limit 1 --report_to none --n_ipu 8 --remove_unused_columns false --dataloader_drop_last true --ignore_mismatched_sizes""",
    ),
    Command(
        "tests:run_audio_classification",
        "tests/test_examples.py",
        README_COMMIT,
        r"""python examples/audio-classification/run_audio_classification.py --model_name_or_path facebook/wav2vec2-base --ipu_config_name Graphcore/wav2vec2-base-ipu --dataset_name superb --do_train --do_eval --output_dir /tmp/tmp_output --overwrite_output_dir true --learning_rate 3e-05 --per_device_train_batch_size 2 --per_device_eval_batch_size 2 --save_strategy epoch --ipu_config_overrides executable_cache_dir=disabled,device_iterations=1,inference_device_iterations=4,gradient_accumulation_steps=16 --num_train_epochs 3 --max_steps -1 --dataloader_num_workers 16 --pad_on_batch_axis --save_steps -1 --save_total_limit 1 --report_to none --n_ipu 8 --dataset_config_name ks --max_length_seconds 1 --attention_mask False""",
    ),
    Command(
        "tests:run_speech_recognition_ctc",
        "tests/test_examples.py",
        README_COMMIT,
        r"""python examples/speech-recognition/run_speech_recognition_ctc.py --model_name_or_path facebook/wav2vec2-base --ipu_config_name Graphcore/wav2vec2-ctc-base-ipu --dataset_name common_voice --do_train --do_eval --output_dir /tmp/tmp_output --overwrite_output_dir true --learning_rate 0.0001 --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --save_strategy epoch --ipu_config_overrides executable_cache_dir=disabled,device_iterations=1,inference_device_iterations=4,gradient_accumulation_steps=32 --num_train_epochs 20 --max_steps -1 --dataloader_num_workers 16 --pad_on_batch_axis --save_steps -1 --save_total_limit 1 --report_to none --n_ipu 8 --dataset_config_name tr --learning_rate 1e-4 --warmup_steps 400 --mask_time_prob 0.0 --layerdrop 0.0 --weight_decay 0.005 --freeze_feature_encoder --text_column_name sentence --length_column_name input_length --chars_to_ignore , ? . ! - \; \: \" “ % ‘ ” � --preprocessing_num_workers 16""",
    ),
)
