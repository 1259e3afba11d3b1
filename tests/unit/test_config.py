import pytest

from bench.core.config import build_config, parse_workload, split_list
from bench.core.errors import UserError


def test_default_matrix_adapts_to_the_machine():
    cpu = build_config(toml=None, flags={}, gpus=0)
    assert (cpu.matrix.device, cpu.matrix.backends, cpu.matrix.world_sizes) == ("cpu", ["gloo"], [1, 2])
    assert cpu.effective_precision() == "fp32"
    gpu = build_config(toml=None, flags={}, gpus=2)
    # one GPU runs the reference only (the planner adds it), unless it is all there is
    assert (gpu.matrix.device, gpu.matrix.backends, gpu.matrix.world_sizes) == ("cuda", ["nccl", "gloo"], [2])
    assert gpu.matrix.workloads == ["gpt-200m[global_batch=64]"] and gpu.effective_precision() == "bf16"
    assert gpu.matrix.global_batch is None  # each workload brings its own batch
    assert build_config(toml=None, flags={}, gpus=8).matrix.world_sizes == [2, 4, 8]
    assert build_config(toml=None, flags={}, gpus=1).matrix.world_sizes == [1]


def test_default_gpu_matrix_adds_a_model_beyond_one_device_on_several_gpus():
    big = "gpt-20b[n_layer=43]"
    cfg = build_config(toml=None, flags={}, gpus=4, beyond=big)
    assert cfg.matrix.workloads == ["gpt-200m[global_batch=64]", big]
    assert cfg.matrix.workload_matrix == {big: {"strategies": ["ddp", "fsdp", "tensor", "pipeline-1f1b"],
                                         "backends": ["nccl"], "world_sizes": [4]}}
    assert build_config(toml=None, flags={}, gpus=1, beyond=big).matrix.workloads == ["gpt-200m[global_batch=64]"]
    # settings of how to measure keep it; choosing the matrix (or the CPU) leaves it out
    assert build_config(toml=None, flags={"repeats": 3}, gpus=4, beyond=big).matrix.workloads[-1] == big
    for flags in ({"strategies": "ddp"}, {"backends": "nccl"}, {"world_sizes": "2"}, {"device": "cpu"}):
        cfg = build_config(toml=None, flags=flags, gpus=4, beyond=big)
        assert big not in cfg.matrix.workloads and cfg.matrix.workload_matrix == {}, flags
    assert build_config(toml=None, flags={"workloads": "gpt-20b"}, gpus=4, beyond=big).matrix.workloads == ["gpt-20b"]
    # a batch or scaling of the user's, or several nodes (whose memories the plan does not read)
    # and an optimizer besides AdamW, whose state sizes it (under SGD alone it would fit one GPU)
    for flags in ({"global_batch": 32}, {"scaling": "weak"}, {"nnodes": 2}, {"training": {"optimizer": "sgd"}},
                  {"training": {"optimizer": "adamw,sgd"}}):
        assert big not in build_config(toml=None, flags=flags, gpus=4, beyond=big).matrix.workloads, flags
    for flags in ({"training": {"optimizer": "adamw"}}, {"training": {"compile": "on"}}):
        assert build_config(toml=None, flags=flags, gpus=4, beyond=big).matrix.workloads[-1] == big, flags
    # the user's own [workload_matrix] entries join the default's narrowing, they do not undo it
    mine = {"gpt-200m[global_batch=64]": {"strategies": ["ddp", "fsdp"]}}
    cfg = build_config(toml={"workload_matrix": mine}, flags={}, gpus=4, beyond=big)
    assert cfg.matrix.workload_matrix[big]["strategies"] == ["ddp", "fsdp", "tensor", "pipeline-1f1b"]
    assert cfg.matrix.workload_matrix["gpt-200m[global_batch=64]"] == {"strategies": ["ddp", "fsdp"]}


@pytest.mark.parametrize("matrix, msg", [
    ({"gpt-small": {"strategies": ["fsdp"]}},
     r"\[workload_matrix.\"gpt-small\"\]: 'gpt-small' is not a workload of the run; name one of 'mlp'"),
    ({"mlp": ["fsdp"]}, r"\[workload_matrix.\"mlp\"\] must be a table"),
    ({"mlp": {"strategy": ["fsdp"]}}, "unknown key 'strategy'; use strategies, backends, world_sizes"),
    ({"mlp": {"strategies": "fsdp"}}, "strategies must be a list of names"),
    ({"mlp": {"strategies": []}}, "strategies is empty: name at least one"),
    ({"mlp": {"backends": ["nccl"]}}, r"backends: 'nccl' is not among the run's backends \(\['gloo'\]\)"),
    ({"mlp": {"world_sizes": [0]}}, "world_sizes: 0 must be >= 1; e.g. world_sizes = \\[1, 2\\]"),
    ({"mlp": {"world_sizes": [4]}}, "world_sizes: 4 is not among the run's world_sizes"),
    ({"mlp": {"world_sizes": 2}}, "world_sizes: 2 must be a list of integers"),
    ({"mlp": {"world_sizes": [2.7]}}, "world_sizes: 2.7 is not an integer"),
    ("fsdp", "workload_matrix must be a TOML table"),
])
def test_workload_matrix_is_checked_before_anything_runs(matrix, msg):
    with pytest.raises(UserError, match=msg):
        build_config(toml={"workloads": ["mlp"], "workload_matrix": matrix}, flags={}, gpus=0)


def test_workload_matrix_world_sizes_come_back_as_integers():
    cfg = build_config(toml={"workloads": ["mlp"], "workload_matrix": {"mlp": {"world_sizes": "2"}}}, flags={}, gpus=0)
    assert cfg.matrix.workload_matrix == {"mlp": {"world_sizes": [2]}}
    with pytest.raises(UserError, match="world sizes: 2 must be a list of integers"):
        build_config(toml={"world_sizes": 2}, flags={}, gpus=0)


def test_flags_override_toml_and_lists_parse():
    cfg = build_config(toml={"steps": 7, "world_sizes": [1, 4], "workloads": ["mlp"]},
                       flags={"steps": 9, "workloads": "gpt-tiny[d_model=128,n_layer=3],mlp"}, gpus=0)
    assert cfg.measurement.steps == 9 and cfg.matrix.world_sizes == [1, 4]
    assert cfg.matrix.workloads == ["gpt-tiny[d_model=128,n_layer=3]", "mlp"]


def test_cpu_device_on_a_gpu_machine_takes_cpu_defaults():
    cfg = build_config(toml=None, flags={"device": "cpu"}, gpus=2)
    assert cfg.matrix.backends == ["gloo"] and cfg.matrix.world_sizes == [1, 2]


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
    meshed = build_config(toml={"options": {"mesh": "2x2"}}, flags={"world_sizes": "4"}, gpus=0)
    assert meshed.matrix.options["mesh"] == "2x2"


def test_settings_come_flat_or_by_section_and_round_trip_through_meta():
    """A TOML file may give a setting flat or in its section's table; [training] holds the knobs
    and lr; a key in another section's table is named; the flat form meta.json keeps rebuilds the
    same configuration."""
    from bench.core.config import validate
    from bench.core.settings import RunConfig

    by_section = build_config(toml={"measurement": {"steps": 7, "repeats": 2}, "profiling": {"sample_hz": 0},
                                    "training": {"lr": 1e-3, "compile": ["off", "on"]}, "budget": {"budget": "90s"},
                                    "output": {"out": "elsewhere"}}, flags={}, gpus=0)
    assert (by_section.measurement.steps, by_section.measurement.repeats, by_section.profiling.sample_hz) == (7, 2, 0)
    assert by_section.training.lr == 1e-3 and by_section.training.knobs["compile"] == ["off", "on"]
    assert by_section.budget.duration == "90s" and by_section.output.out == "elsewhere"
    flat = build_config(toml={"steps": 7, "repeats": 2, "sample_hz": 0, "lr": 1e-3, "budget": "90s",
                              "training": {"compile": ["off", "on"]}, "out": "elsewhere"}, flags={}, gpus=0)
    assert flat == by_section
    assert validate(by_section.flat()) == by_section == RunConfig.from_flat(by_section.flat())
    with pytest.raises(UserError, match="unknown setting 'measurement.device'"):
        build_config(toml={"measurement": {"device": "cpu"}}, flags={}, gpus=0)
    assert build_config(toml={"measurement": {"steps": 7}}, flags={"steps": 9}, gpus=0).measurement.steps == 9


def test_run_help_groups_the_flags_by_section(capsys):
    from bench.cli.main import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    for sec in ("matrix", "measurement", "budget", "training", "profiling", "nodes", "output"):
        assert f"{sec} settings:" in out, sec
    assert out.index("measurement settings:") < out.index("\n  --steps ") < out.index("budget settings:")


@pytest.mark.parametrize("path", sorted(__import__("pathlib").Path(__file__).parents[2].glob("configs/*.toml")),
                         ids=lambda p: p.name)
def test_every_shipped_config_builds(path):
    from bench.core.config import load_toml

    cfg = build_config(toml=load_toml(str(path)), flags={}, gpus=4)
    assert cfg.matrix.workloads and cfg.measurement.steps >= 1
