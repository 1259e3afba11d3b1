from bench.config import build_config
from bench.launch import group, plan


def test_skips_carry_reasons_and_the_reference_is_added():
    cfg = build_config(toml=None, flags={"workloads": "mlp", "strategies": "dataparallel,ddp",
                                         "backends": "nccl,gloo", "world_sizes": "1,2", "device": "cpu"}, gpus=0)
    cells, _ = plan(cfg, gpus=0)
    by = {(c.strategy, c.backend, c.world_size): c for c in cells}
    assert by[("single", "none", 1)].reason is None  # added: parity needs it
    assert "needs CUDA" in by[("dataparallel", "none", 2)].reason
    assert "NCCL needs CUDA" in by[("ddp", "nccl", 2)].reason
    assert by[("ddp", "gloo", 2)].reason is None


def test_gpu_cells_beyond_the_visible_gpus_are_skipped():
    cfg = build_config(toml=None, flags={"workloads": "mlp", "strategies": "ddp,dataparallel",
                                         "world_sizes": "1,2,4"}, gpus=2)
    cells, _ = plan(cfg, gpus=2)
    by = {(c.strategy, c.backend, c.world_size): c for c in cells}
    assert "world size 4 > 2 visible GPU(s)" in by[("ddp", "nccl", 4)].reason
    assert by[("dataparallel", "none", 2)].reason is None and by[("dataparallel", "none", 2)].nproc == 1


def test_groups_by_nproc_and_backend_reference_first():
    cfg = build_config(toml=None, flags={"workloads": "mlp,gpt-tiny", "strategies": "ddp,dataparallel",
                                         "world_sizes": "1,2"}, gpus=2)
    cells, _ = plan(cfg, gpus=2)
    groups = group(cells, cfg.backends, cfg.device)
    assert [(g.nproc, g.backend) for g in groups] == [(1, "nccl"), (1, "gloo"), (2, "nccl"), (2, "gloo")]
    first = groups[0]
    assert first.cells[0].strategy == "single"
    assert {c.strategy for c in first.cells} == {"single", "ddp", "dataparallel"}
