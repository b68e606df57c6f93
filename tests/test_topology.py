"""The device-topology rules of `optimum_ipu.topology` with tensor parallelism: a replica's stages have
`tensor_parallel_size` devices each, one process per device slot; with `tensor_parallel_size` 1 every rule and
message is the one without it."""

from __future__ import annotations

import pytest

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig
from optimum_ipu.topology import (
    check_processes,
    replicas_per_process,
    replication_for_devices,
    stages_per_process,
    tensor_parallel_size,
)


def test_processes_are_stages_times_replicas_times_tensor_parallel():
    config = IPUConfig(layers_per_ipu=[2, 2], tensor_parallel_size=2, gradient_accumulation_steps=2)
    assert config.device_slots == 4 and tensor_parallel_size(config) == 2
    check_processes(config, 4)
    check_processes(config, 1)  # one process runs every slot in turn
    with pytest.raises(IncompatibleIPUConfigError) as err:
        check_processes(config, 2)
    assert str(err.value) == (
        "2 processes, but `ipus_per_replica` (2) x `replication_factor` (1) x `tensor_parallel_size` (2) make 4 "
        "device slots, one a process; launch torchrun --nproc_per_node 4, or set `tensor_parallel_size` to 1"
    )
    with pytest.raises(IncompatibleIPUConfigError, match=r"--nproc_per_node 4, or set `replication_factor` to 2 "):
        check_processes(config, 8)
    with pytest.raises(IncompatibleIPUConfigError, match=r"--nproc_per_node 4, or run one process$"):
        check_processes(config, 3)
    few = IPUConfig(layers_per_ipu=[2, 2], tensor_parallel_size=2, gradient_accumulation_steps=1)
    with pytest.raises(IncompatibleIPUConfigError, match="`gradient_accumulation_steps` 1 is below the 2"):
        check_processes(few, 4)
    check_processes(IPUConfig(tensor_parallel_size=4), 4)  # one stage on 4 devices: no micro-batch needed
    check_processes(
        IPUConfig(layers_per_ipu=[1, 1], tensor_parallel_size=2, replication_factor=2, gradient_accumulation_steps=2), 8
    )


def test_without_tensor_parallelism_the_messages_are_unchanged():
    config = IPUConfig(layers_per_ipu=[2, 2], gradient_accumulation_steps=2)
    with pytest.raises(IncompatibleIPUConfigError) as err:
        check_processes(config, 3)
    assert str(err.value) == (
        "3 processes, but `ipus_per_replica` (2) x `replication_factor` (1) make 2 device slots, one a process; "
        "launch torchrun --nproc_per_node 2, or run one process"
    )
    with pytest.raises(IncompatibleIPUConfigError) as err:
        replication_for_devices(config, 5)
    assert str(err.value) == (
        "n_ipu 5 is not a multiple of `ipus_per_replica` 2 (one replica needs 2 device slots); use a multiple of 2, "
        "or fewer stages in `layers_per_ipu`"
    )
    assert replication_for_devices(config, 8) == 4


def test_a_pod_holds_replicas_of_stages_times_tensor_parallel_devices():
    config = IPUConfig(layers_per_ipu=[2, 2], tensor_parallel_size=2)
    assert replication_for_devices(config, 8) == 2 and replication_for_devices(config, 4) == 1
    with pytest.raises(IncompatibleIPUConfigError) as err:
        replication_for_devices(config, 6, "--n_ipu")
    assert str(err.value) == (
        "--n_ipu 6 is not a multiple of `ipus_per_replica` 2 x `tensor_parallel_size` 2 (one replica needs 4 device "
        "slots); use a multiple of 4, or fewer stages in `layers_per_ipu` or a smaller `tensor_parallel_size`"
    )
    # the training value, whatever the mode
    assert replication_for_devices(IPUConfig(tensor_parallel_size=2, inference_tensor_parallel_size=1).eval(), 4) == 2


def test_interleaved_stages_count_the_ranks_of_a_replicas_pipeline():
    """4 stages x 2 tensor-parallel on 4 processes: 2 pipeline ranks a replica, 2 stages each."""
    config = IPUConfig(layers_per_ipu=[1, 1, 1, 1], tensor_parallel_size=2, gradient_accumulation_steps=4)
    assert stages_per_process(config, 4, "Interleaved1F1B") == 2
    assert stages_per_process(config, 8, "1F1B") == 1
    check_processes(config, 4, stages_per_process=2)
    with pytest.raises(IncompatibleIPUConfigError) as err:
        stages_per_process(config, 4, "GPipe")
    assert "4 stages over 2 processes a replica's pipeline (x 2 tensor-parallel) are 2 each" in str(err.value)
    assert str(err.value).endswith("or launch torchrun --nproc_per_node 8")
    assert replicas_per_process(config, 4) == 1  # the interleaved layout fits
    # processes that do not split into whole tensor-parallel groups: one stage each, and check_processes refuses
    assert stages_per_process(config, 3, "Interleaved1F1B") == 1


def test_inference_replicas_are_shared_out_over_tensor_parallel_groups():
    config = IPUConfig(inference_replication_factor=4, inference_tensor_parallel_size=2)
    assert tensor_parallel_size(config) == 1 and tensor_parallel_size(config, inference=True) == 2
    assert replicas_per_process(config, 4, inference=True) == 2  # 2 groups of 2 processes, 2 replicas each
    assert replicas_per_process(config, 1, inference=True) == 4
    assert replicas_per_process(IPUConfig(inference_replication_factor=4), 4, inference=True) == 1
