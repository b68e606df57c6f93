"""IPUTrainerState: Optimum Graphcore's state class, kept by IPUTrainer, files read by transformers and by it."""

from __future__ import annotations

import json
import time

import transformers

import optimum_ipu
import optimum_ipu.trainer
from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainerState

from .helpers import TRAINER_CLASS, classification_dataset, training_arguments
from .tiny_models import tiny_model


def test_importable_where_optimum_graphcore_had_it():
    assert optimum_ipu.trainer.IPUTrainerState is IPUTrainerState is optimum_ipu.IPUTrainerState
    assert issubclass(IPUTrainerState, transformers.TrainerState)
    assert IPUTrainerState().start_time == -1.0


def test_trainer_keeps_it_and_its_checkpoints_resume_as_transformers_reads_them(tmp_path):
    args = training_arguments(tmp_path / "a", save_strategy="steps", save_steps=2, max_steps=4)
    trainer = IPUTrainer(tiny_model(TRAINER_CLASS), IPUConfig(), args, train_dataset=classification_dataset(16))
    assert isinstance(trainer.state, IPUTrainerState) and trainer.state.start_time == -1.0
    before = time.time()
    trainer.train()
    state = trainer.state
    assert isinstance(state, IPUTrainerState) and state.global_step == 4
    assert before <= state.start_time <= time.time()
    assert [entry["step"] for entry in state.log_history if "loss" in entry] == [1, 2, 3, 4]
    saved = tmp_path / "a" / "checkpoint-2" / "trainer_state.json"
    assert "start_time" not in json.loads(saved.read_text())
    stock = transformers.TrainerState.load_from_json(str(saved))  # what transformers.Trainer's resume does
    assert stock.global_step == 2
    resumed_args = training_arguments(tmp_path / "b", max_steps=4)
    resumed = IPUTrainer(tiny_model(TRAINER_CLASS), IPUConfig(), resumed_args, train_dataset=classification_dataset(16))
    started = time.time()
    resumed.train(resume_from_checkpoint=str(saved.parent))
    assert isinstance(resumed.state, IPUTrainerState) and resumed.state.global_step == 4
    assert resumed.state.start_time >= started  # this call's start, as train_runtime measures


def test_reads_optimum_graphcore_state_files(tmp_path):
    written = transformers.TrainerState(global_step=7, max_steps=10, log_history=[{"loss": 0.5, "step": 7}])
    fields = json.loads(json.dumps(written.__dict__))
    (tmp_path / "og.json").write_text(json.dumps({**fields, "start_time": 1700000000.5}))
    state = IPUTrainerState.load_from_json(str(tmp_path / "og.json"))
    assert (state.global_step, state.start_time, state.log_history) == (7, 1700000000.5, [{"loss": 0.5, "step": 7}])
    written.save_to_json(str(tmp_path / "stock.json"))
    assert IPUTrainerState.load_from_json(str(tmp_path / "stock.json")).start_time == -1.0
