import pytest

from bench.core.config import build_config, parse_workload, split_list
from bench.core.errors import UserError


def test_default_matrix_adapts_to_the_machine():
    cpu = build_config(toml=None, flags={}, gpus=0)
    assert (cpu.device, cpu.backends, cpu.world_sizes) == ("cpu", ["gloo"], [1, 2])
    assert cpu.effective_precision() == "fp32"
    gpu = build_config(toml=None, flags={}, gpus=2)
    # one GPU runs the reference only (the planner adds it), unless it is all there is
    assert (gpu.device, gpu.backends, gpu.world_sizes) == ("cuda", ["nccl", "gloo"], [2])
    assert "gpt-200m" in gpu.workloads and gpu.effective_precision() == "bf16" and gpu.global_batch == 64
    assert build_config(toml=None, flags={}, gpus=8).world_sizes == [2, 4, 8]
    assert build_config(toml=None, flags={}, gpus=1).world_sizes == [1]
    # the default batch is the default workload's: another workload brings its own
    assert build_config(toml=None, flags={"workloads": "gpt-small"}, gpus=2).global_batch is None


def test_flags_override_toml_and_lists_parse():
    cfg = build_config(toml={"steps": 7, "world_sizes": [1, 4], "workloads": ["mlp"]},
                       flags={"steps": 9, "workloads": "gpt-tiny[d_model=128,n_layer=3],mlp"}, gpus=0)
    assert cfg.steps == 9 and cfg.world_sizes == [1, 4]
    assert cfg.workloads == ["gpt-tiny[d_model=128,n_layer=3]", "mlp"]


def test_cpu_device_on_a_gpu_machine_takes_cpu_defaults():
    cfg = build_config(toml=None, flags={"device": "cpu"}, gpus=2)
    assert cfg.backends == ["gloo"] and cfg.world_sizes == [1, 2]


@pytest.mark.parametrize("flags, msg", [
    ({"backends": "mpi"}, "backend 'mpi' unknown"),
    ({"world_sizes": "1,two"}, "'two' is not an integer"),
    ({"world_sizes": "0"}, "0 must be >= 1"),
    ({"steps": 0}, "steps=0 must be >= 1"),
    ({"device": "tpu"}, "device 'tpu' unknown"),
    ({"workloads": "gpt-tiny[d_model]"}, "must be key=<integer>"),
])
def test_bad_values_are_named(flags, msg):
    with pytest.raises(UserError, match=msg):
        build_config(toml=None, flags=flags, gpus=0)


def test_unknown_toml_key_is_named():
    with pytest.raises(UserError, match="unknown setting 'stepz'"):
        build_config(toml={"stepz": 3}, flags={}, gpus=0)


def test_split_and_parse():
    assert split_list("a, b[x=1,y=2] ,c") == ["a", "b[x=1,y=2]", "c"]
    assert parse_workload("gpt-small[d_model=512]") == ("gpt-small", {"d_model": 512})
    assert parse_workload("pkg.mod:make") == ("pkg.mod:make", {})


def test_a_mesh_that_fits_no_world_size_fails_before_launch():
    with pytest.raises(UserError, match="mesh 2x4 has 8 ranks but world sizes are \\[1, 2\\]"):
        build_config(toml={"options": {"mesh": "2x4"}}, flags={}, gpus=0)
    with pytest.raises(UserError, match="must look like 2x2"):
        build_config(toml={"options": {"mesh": "four"}}, flags={"world_sizes": "4"}, gpus=0)
    assert build_config(toml={"options": {"mesh": "2x2"}}, flags={"world_sizes": "4"}, gpus=0).options["mesh"] == "2x2"
