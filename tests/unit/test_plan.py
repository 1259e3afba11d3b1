import pytest

from bench.core.config import build_config
from bench.core.errors import UserError
from bench.plan.matrix import group, plan


def planned(flags, gpus):
    cfg = build_config(toml=None, flags=flags, gpus=gpus)
    cells, wls, metrics = plan(cfg, gpus=gpus)
    return {(p.spec.strategy, p.spec.backend, p.spec.n_devices): p for p in cells}, cells, wls


def test_skips_carry_reasons_and_the_reference_is_added():
    by, _, _ = planned({"workloads": "mlp", "strategies": "dataparallel,ddp", "backends": "nccl,gloo",
                        "world_sizes": "1,2", "device": "cpu"}, 0)
    assert by[("single", "gloo", 1)].reason is None  # added: parity needs it; runs under the group's gloo
    assert by[("single", "gloo", 1)].spec.role == "reference"
    assert "needs CUDA" in by[("dataparallel", "gloo", 2)].reason
    assert "NCCL needs CUDA" in by[("ddp", "nccl", 2)].reason
    assert by[("ddp", "gloo", 2)].reason is None


def test_a_reference_measures_its_rounding_only_where_a_multi_device_cell_reads_it():
    """The rounding probe trains the reference's parity steps a second time: worth it where a
    multi-device cell's tolerance comes from it, wasted where none runs (one device, or every
    multi-device cell of the workload skipped)."""
    from bench.train.rounding import probes

    by, _, _ = planned({"workloads": "mlp", "strategies": "ddp", "world_sizes": "2", "device": "cpu"}, 0)
    assert by[("single", "gloo", 1)].spec.compared and probes(by[("single", "gloo", 1)].spec)
    by, _, _ = planned({"workloads": "mlp", "strategies": "single", "world_sizes": "1", "device": "cpu"}, 0)
    assert not by[("single", "gloo", 1)].spec.compared and not probes(by[("single", "gloo", 1)].spec)
    by, _, _ = planned({"workloads": "mlp", "strategies": "dataparallel", "world_sizes": "2", "device": "cpu"}, 0)
    assert by[("dataparallel", "gloo", 2)].reason and not by[("single", "gloo", 1)].spec.compared


def test_gpu_cells_beyond_the_visible_gpus_are_skipped_and_devices_are_planned():
    by, _, _ = planned({"workloads": "mlp", "strategies": "ddp,dataparallel", "world_sizes": "1,2,4"}, 2)
    assert "world size 4 > 2 visible GPU(s)" in by[("ddp", "nccl", 4)].reason
    dp2 = by[("dataparallel", "nccl", 2)]
    assert dp2.reason is None and dp2.spec.n_procs == 1 and dp2.spec.n_devices == 2
    assert dp2.spec.devices == (0, 1) and by[("ddp", "gloo", 2)].spec.devices == (0, 1)


def test_groups_by_nproc_and_backend_reference_first():
    _, cells, _ = planned({"workloads": "mlp,gpt-tiny", "strategies": "ddp,dataparallel", "world_sizes": "1,2"}, 2)
    groups = group(cells)
    # one-rank cells run under one backend: a Gloo DDP of one rank would repeat the NCCL one
    assert [(g.n_procs, g.backend) for g in groups] == [(1, "nccl"), (2, "nccl"), (2, "gloo")]
    first = groups[0]
    assert first.cells[0].strategy == "single"
    assert {c.strategy for c in first.cells} == {"single", "ddp", "dataparallel"}


def test_one_rank_cells_are_measured_once_across_backends():
    by, _, _ = planned({"workloads": "mlp", "strategies": "ddp,fsdp", "world_sizes": "1,2"}, 2)
    for s in ("ddp", "fsdp"):
        assert by[(s, "nccl", 1)].reason is None and by[(s, "gloo", 2)].reason is None
        assert "would repeat the nccl one" in by[(s, "gloo", 1)].reason
    # with one backend asked for, its one-rank cells run
    by, _, _ = planned({"workloads": "mlp", "strategies": "ddp", "backends": "gloo", "world_sizes": "1,2"}, 2)
    assert by[("ddp", "gloo", 1)].reason is None


def test_workload_variants_keep_their_dimensions_in_the_name():
    by, cells, wls = planned({"workloads": "mlp,mlp[width=1024],convnet[width=16]", "strategies": "single",
                              "device": "cpu"}, 0)
    assert list(wls) == ["mlp", "mlp(width=1024)", "convnet(width=16)"]
    assert {p.spec.workload.name for p in cells} == set(wls)
    assert wls["mlp(width=1024)"].params > wls["mlp"].params


@pytest.mark.parametrize("flags", [
    {"workloads": "tests.foreign_models:fused_gpt[global_batch=12]"},
    {"workloads": "gpt-tiny[global_batch=12]"},
    {"workloads": "gpt-tiny[global_batch=4]", "global_batch": 12},
])
def test_a_global_batch_among_the_dimensions_builds_in_the_ranks(flags):
    """The ranks build the workload from the cell: its global batch and a global_batch dimension
    must not both reach the factory (a TypeError in every cell)."""
    from bench.train.cell import cell_workload

    _, cells, _ = planned({**flags, "strategies": "single", "device": "cpu"}, 0)
    assert cells[0].spec.workload.global_batch == 12
    assert cell_workload(cells[0].spec).global_batch == 12


def test_options_are_validated_and_resolved_per_strategy():
    by, _, _ = planned({"workloads": "gpt-tiny[n_layer=6]", "strategies": "pipeline-1f1b,ddp,dp-pp",
                        "world_sizes": "2,4", "device": "cpu", "options": {"micro_batches": "4"}}, 0)
    assert by[("pipeline-1f1b", "gloo", 2)].spec.options == {"micro_batches": 4, "pp_balance": "blocks"}
    assert by[("ddp", "gloo", 2)].spec.options == {"bucket_mb": 25.0, "ddp_grad_as_bucket_view": False,
                                                   "ddp_static_graph": False}  # its own only, defaults filled
    assert by[("pipeline-1f1b", "gloo", 2)].spec.labels == {"schedule": "1f1b", "micro_batches": 4, "mesh": "pp2"}
    assert by[("dp-pp", "gloo", 4)].spec.labels["mesh"] == "dp2xpp2"
    with pytest.raises(UserError, match="micro_batches='abc' must be an integer"):
        planned({"workloads": "gpt-tiny", "strategies": "pipeline-1f1b", "device": "cpu",
                 "options": {"micro_batches": "abc"}}, 0)
    with pytest.raises(UserError, match="option 'colour' is not an option.*known: bucket_mb"):
        planned({"workloads": "gpt-tiny", "strategies": "ddp", "device": "cpu", "options": {"colour": 1}}, 0)


def test_tensor_parallel_needs_a_plan_from_the_workload():
    by, _, _ = planned({"workloads": "mlp", "strategies": "tensor", "world_sizes": "2", "device": "cpu"}, 0)
    assert "declares no tensor-parallel plan" in by[("tensor", "gloo", 2)].reason


def test_the_default_budget_stands_aside_when_the_user_fixes_the_measurement():
    """`--steps 10 --steps-max 10` under the GPU's default 10-minute budget keeps 10 steps: a cell
    meant to run exactly as a plain loop is not rewritten to 2 steps and up to 500 by the plan."""
    from bench.plan.budget import budget_plan

    cfg = build_config(toml=None, flags={"workloads": "mlp", "strategies": "ddp", "world_sizes": "1,2",
                                         "steps": 10, "warmup": 3, "steps_max": 10, "warmup_max": 3}, gpus=2)
    assert cfg.budget.duration is None and set(cfg.budget.pinned) == {"steps", "warmup", "steps_max", "warmup_max"}
    # nothing pinned
    assert build_config(toml=None, flags={"workloads": "mlp"}, gpus=2).budget.duration in ("10m", "600s")

    # An explicit budget still plans, but keeps what the user set and says so.
    cfg = build_config(toml=None, flags={"workloads": "mlp", "strategies": "ddp", "world_sizes": "1,2",
                                         "steps": 10, "steps_max": 10, "budget": "5m"}, gpus=2)
    cells, _, _ = plan(cfg, gpus=2)
    out, text = budget_plan(cfg, cells, 300.0)
    m = [p.spec.measure for p in out if p.reason is None]
    assert m and all(x.steps == 10 and x.steps_max == 10 for x in m)
    assert all(x.warmup == 2 for x in m)  # not pinned: planned
    assert "kept as given: steps, steps_max" in text and "at least 10 steps" in text


def test_a_cells_earliest_rank_error_is_its_reason_whatever_order_they_are_read_in():
    """The launcher reads the ranks' event files in rank order, so a peer's consequence (rank 0: a
    broken collective) can be read before its cause (rank 1, earlier)."""
    from bench.runtime.crash import earliest

    cause, consequence = (10.0, "rank 1: RuntimeError: cause"), (12.5, "rank 0: DistBackendError: peer gone")
    assert earliest(earliest(None, consequence), cause) == cause
    assert earliest(earliest(None, cause), consequence) == cause
    assert earliest((10.0, "rank 0: a"), (10.0, "rank 1: b")) == (10.0, "rank 0: a")  # a tie keeps the first


def test_a_budget_plan_charges_gloo_and_one_process_multi_gpu_cells_more_on_gpus():
    """The cost model fitted on 4x H100: a group 23 s; a cell 0.5 s (NCCL) / 0.6 s (Gloo) / 0.7 s (one
    process on several GPUs), plus 0.1 / 0.15 s per extra rank, plus 8.5 / 6 / 10 s per billion
    parameters at gpt-200m's FLOPs per parameter and step (a workload counts as its parameters scaled by
    its own), and for Gloo 21 s per billion parameters at two ranks (its ring's 2(n-1)/n). A small GPU plan by hand: the
    reference (nccl), ddp x2 (nccl, gloo), dataparallel x2 (nccl, one process on 2 GPUs), in 3
    process groups, mlp (927,760 parameters)."""
    from bench.core.config import build_config
    from bench.plan.budget import budget_plan, cell_overhead, step_work

    cfg = build_config(toml=None, flags={"device": "cuda", "workloads": "mlp", "strategies": "ddp,dataparallel",
                                         "backends": "nccl,gloo", "world_sizes": "2"}, gpus=2)
    cells, _, _ = plan(cfg, 2)
    run = sorted((c.spec.strategy, c.spec.backend) for c in cells if c.reason is None)
    assert run == [("dataparallel", "nccl"), ("ddp", "gloo"), ("ddp", "nccl"), ("single", "nccl")], run
    assert len(group(cells)) == 3  # 1 process nccl (single, dataparallel), 2 nccl, 2 gloo
    # 3 starts x 23 s; single on nccl 0.5 + 8.5e-9 s a parameter-equivalent, ddp x2 on nccl 0.5 + 0.1
    # + 8.5e-9; dataparallel (one process, 2 GPUs) 0.7 + 10e-9; ddp gloo x2 0.6 + 0.15 + 6e-9 a
    # parameter-equivalent + 21e-9 a parameter. mlp does 5.55 MFLOPs a sample, 64 samples a step:
    # 383 FLOPs a parameter, so its 927,760 parameters count as 848.
    p = 927_760
    assert cells[0].spec.workload.params == p
    w = step_work(cells[0].spec.workload) * 1e9
    assert round(w) == 848
    # each cell's overhead x 1.5: on CUDA its profiled steps run in the group's profile pass (a rebuild)
    fixed = 3 * 23.0 + 1.5 * ((0.5 + 8.5e-9 * w) + (0.6 + 8.5e-9 * w) + (0.7 + 10e-9 * w)
                              + (0.75 + 6e-9 * w + 21e-9 * p))
    out, text = budget_plan(cfg, cells, 120.0)
    caps = {round(c.spec.measure.time_cap_s, 9) for c in out if c.reason is None}
    assert caps == {round((0.8 * 120 - fixed) / 4, 9)}, (caps, text)
    assert cell_overhead("cpu", "gloo") == 1.0 and cell_overhead("cpu", "gloo", 2) == 1.0
    assert cell_overhead("cpu", "gloo", params=10**9) == 1.0  # not fitted on CPU: no size term
    assert abs(cell_overhead("cuda", "gloo", params=236_144_640) - (0.6 + 6 * 0.23614464)) < 1e-9
    # a step of twice the fitted work per parameter: the per-billion term doubles, the ring's does not
    assert abs(cell_overhead("cuda", "gloo", params=236_144_640, ranks=2, work=2 * 0.23614464)
               - (0.6 + 0.15 + 6 * 2 * 0.23614464 + 21 * 0.23614464)) < 1e-9
    # Gloo at 4 ranks: 3 extra ranks, and its ring moves 2 * 3/4 of the gradients
    assert abs(cell_overhead("cuda", "gloo", params=236_144_640, ranks=4)
               - (0.6 + 3 * 0.15 + (6 + 21 * 1.5) * 0.23614464)) < 1e-9
    # the default 4-GPU matrix plans without refusing, and says so up front
    cfg4 = build_config(toml=None, flags={"device": "cuda"}, gpus=4)
    cells4, _, _ = plan(cfg4, 4)
    _, text4 = budget_plan(cfg4, cells4, 600.0)
    assert text4.startswith("budget 600s: ") and "cells x 1 repeat(s)" in text4


def test_a_budget_counts_a_weak_scaling_cell_by_its_per_device_step():
    """Under weak scaling a cell of n devices trains n times the batch, n devices each doing one
    device's share: its overhead is that of one device's step, not of the whole batch on one."""
    from bench.core.config import build_config
    from bench.plan.budget import _overhead

    flags = {"device": "cuda", "workloads": "gpt-200m", "strategies": "ddp", "backends": "nccl",
             "world_sizes": "1,4", "global_batch": 64}
    strong = {p.spec.n_devices: p.spec for p in plan(build_config(toml=None, flags=flags, gpus=4), 4)[0]}
    weak = {(p.spec.strategy, p.spec.n_devices, p.spec.workload.global_batch): p.spec
            for p in plan(build_config(toml=None, flags={**flags, "scaling": "weak"}, gpus=4), 4)[0]}
    cfg = build_config(toml=None, flags=flags, gpus=4)
    assert _overhead(cfg, weak[("ddp", 4, 256)]) == pytest.approx(_overhead(cfg, strong[4]))
    assert _overhead(cfg, weak[("single", 1, 256)]) > 3 * _overhead(cfg, strong[1])


def test_the_model_beyond_one_device_is_sized_from_the_visible_gpus(monkeypatch):
    import bench.plan.memory as memory

    # sized with AdamW's state: 16 bytes a parameter (fp32 values, gradients and two state values)
    monkeypatch.setattr(memory, "device_memory", lambda device: 80 * 2**30)
    assert memory.beyond_one_device() == "gpt-20b[n_layer=12]"
    monkeypatch.setattr(memory, "device_memory", lambda device: 143771 * 2**20)  # an H200 as NVML reports it
    assert memory.beyond_one_device() == "gpt-20b[n_layer=21]"
    monkeypatch.setattr(memory, "device_memory", lambda device: None)  # a MIG slice, no NVML
    assert memory.beyond_one_device() is None
    assert memory.beyond_one_device("cpu") is None


def test_the_pacer_shares_the_time_left_among_the_cells_left_at_the_pace_so_far():
    """Fixed costs above the plan's model (a 4-GPU matrix can take 576 s of a 10-minute budget planned
    with 400 s) do not overrun the budget: before each group the cap is drawn again from the time left."""
    from bench.core.config import build_config
    from bench.plan.budget import Pacer, budget_plan

    cfg = build_config(toml=None, flags={"device": "cuda", "workloads": "mlp", "strategies": "ddp",
                                         "backends": "nccl,gloo", "world_sizes": "2"}, gpus=2)
    cells, _, _ = plan(cfg, 2)
    out, _ = budget_plan(cfg, cells, 120.0)
    groups = group(out)
    assert [len(g.cells) for g in groups] == [1, 1, 1]  # single nccl; ddp nccl x2; ddp gloo x2
    planned = groups[0].cells[0].measure.time_cap_s
    pacer = Pacer(cfg, groups)
    fixed = [pacer.fixed(g) for g in groups]
    # On schedule: the first group's cap is what is left of 90% of the time after the fixed costs
    g0 = pacer.next_group(0, 120.0)
    expect = min((0.9 * 120.0 - sum(fixed)) / 3, 2 * planned)
    assert abs(g0.cells[0].measure.time_cap_s - expect) < 1e-9
    assert groups[0].cells[0].measure.time_cap_s == planned  # the plan itself is not changed
    # The first group took three times what the model said: the rest is charged at that pace
    modelled = fixed[0] + expect
    pacer.group_done(120.0 - 3 * modelled)
    assert abs(pacer.pace - 3.0) < 1e-9
    g1 = pacer.next_group(1, 120.0 - 3 * modelled)
    assert g1.cells[0].measure.time_cap_s == 0.1  # nothing left beyond the fixed costs: the floor
    # Far ahead of schedule: at most twice the plan's cap
    fast = Pacer(cfg, groups)
    assert fast.next_group(0, 10_000.0).cells[0].measure.time_cap_s == 2 * planned
    # A group killed at a cell's timeout (a hang) costs its time but not the pace: the groups after it
    # are paced by the clean ones (counting it drove every later cap to the floor)
    groups6 = group(budget_plan(cfg, cells, 600.0)[0])
    counted, hung = Pacer(cfg, groups6), Pacer(cfg, groups6)
    for p in (counted, hung):
        p.next_group(0, 600.0)
    left = 600.0 - 2 * (counted.fixed(groups6[0]) + counted.cap(0, 600.0))
    counted.group_done(left)
    hung.group_done(left, clean=False)
    assert abs(counted.pace - 2.0) < 1e-9 and hung.pace == 1.0 and hung.spent == hung.modelled == 0.0
    cap_counted, cap_hung = (p.next_group(1, left).cells[0].measure.time_cap_s for p in (counted, hung))
    assert 0.1 < cap_counted < cap_hung < 2 * groups6[0].cells[0].measure.time_cap_s, (cap_counted, cap_hung)


def test_an_adaptive_chunk_fits_the_time_left_of_its_allowance():
    import numpy as np

    from bench.train.timed import CHUNK, chunk_within

    assert chunk_within(None, 50, 1.0) == CHUNK and chunk_within(np.array([]), 50, 1.0) == CHUNK
    assert chunk_within(np.array([0.01, 0.01]), 3, None) == 3  # no allowance: the steps left
    assert chunk_within(np.array([0.01, 0.01]), 50, 1.0) == CHUNK
    # a 0.55 s Gloo step with 0.2 s of warm-up allowed: spent after the first two
    assert chunk_within(np.array([1.2, 0.55]), 50, 0.2) == 0
    # 0.3 s left of the allowance, 0.1 s steps: 3, not a whole chunk of 5
    assert chunk_within(np.array([0.1, 0.1]), 50, 0.5) == 3
    assert chunk_within(np.array([0.1, 0.1]), 0, 0.5) == 0


def test_the_pacer_keeps_the_budget_when_the_capped_part_runs_over():
    """Fixed costs exactly as modelled, but each capped slot takes 1.5 x its cap (warm-up may spend
    half a cap beyond the timed cap): the pace divides the whole time left, so a 600 s budget is kept
    (charged to the fixed costs alone it would overrun by about 22 s)."""
    from bench.core.config import build_config
    from bench.plan.budget import Pacer, budget_plan

    budget = 600.0
    cfg = build_config(toml=None, flags={"device": "cuda", "workloads": "mlp", "strategies": "ddp",
                                         "backends": "nccl,gloo", "world_sizes": "2"}, gpus=2)
    cells, _, _ = plan(cfg, 2)
    groups = group(budget_plan(cfg, cells, budget)[0])
    pacer, t = Pacer(cfg, groups), 0.0
    for gid in range(len(groups)):
        g = pacer.next_group(gid, budget - t)
        t += pacer.fixed(g) + 1.5 * sum(c.measure.repeats for c in g.cells) * g.cells[0].measure.time_cap_s
        pacer.group_done(budget - t)
    assert t <= budget, t


def test_profiled_steps_run_in_a_pass_at_the_end_on_cuda_and_inline_on_cpu():
    """--profile-at auto: "end" on CUDA (a GPU profiler session slows the process's later timed
    work), "inline" on CPU; either can be asked for; the pass's rebuild is charged to a budget."""
    from bench.plan.budget import _overhead

    def at(flags, gpus):
        _, cells, _ = planned(flags, gpus)
        return {p.spec.measure.profile_at for p in cells}

    assert at({"workloads": "mlp", "strategies": "ddp", "world_sizes": "2"}, 2) == {"end"}
    assert at({"workloads": "mlp", "strategies": "ddp", "world_sizes": "2", "device": "cpu"}, 0) == {"inline"}
    assert at({"workloads": "mlp", "strategies": "ddp", "world_sizes": "2", "profile_at": "inline"}, 2) == {"inline"}
    assert at({"workloads": "mlp", "strategies": "ddp", "world_sizes": "2", "device": "cpu",
               "profile_at": "end"}, 0) == {"end"}
    cfg = build_config(toml=None, flags={"workloads": "mlp", "strategies": "ddp", "world_sizes": "2"}, gpus=2)
    cells = [p.spec for p in plan(cfg, gpus=2)[0] if p.reason is None]
    inline = build_config(toml=None, flags={"workloads": "mlp", "strategies": "ddp", "world_sizes": "2",
                                            "profile_at": "inline"}, gpus=2)
    for c in cells:
        assert _overhead(cfg, c) == pytest.approx(1.5 * _overhead(inline, _inline(c)))
    with pytest.raises(UserError, match="profile_at 'later' unknown; use auto, end, inline"):
        build_config(toml=None, flags={"profile_at": "later"}, gpus=2)


def _inline(c):
    import dataclasses

    return dataclasses.replace(c, measure=dataclasses.replace(c.measure, profile_at="inline"))


def test_backend_strategies_limit_what_a_backend_runs():
    from bench.core.config import build_config
    from bench.core.errors import UserError

    cfg = build_config(toml=None, flags={}, gpus=4)  # the default GPU matrix
    cells, _, _ = plan(cfg, 4)
    gloo = {p.spec.strategy for p in cells if p.spec.backend == "gloo"}
    assert gloo == {"ddp"} and {p.spec.workload.name for p in cells} == {"gpt-200m(global_batch=64)"}
    assert {"tensor", "pipeline-1f1b", "ddp"} <= {p.spec.strategy for p in cells if p.spec.backend == "nccl"}
    # the user's own strategies: every one on every backend
    mine = build_config(toml=None, flags={"strategies": "ddp,tensor"}, gpus=4)
    assert mine.matrix.backend_strategies == {}
    toml = build_config(toml={"backend_strategies": {"gloo": ["ddp"]}}, flags={"strategies": "ddp,tensor"}, gpus=4)
    assert {p.spec.strategy for p in plan(toml, 4)[0] if p.spec.backend == "gloo"} == {"ddp"}
    with pytest.raises(UserError, match="backend_strategies: unknown backend 'mpi'"):
        build_config(toml={"backend_strategies": {"mpi": ["ddp"]}}, flags={}, gpus=4)
    with pytest.raises(UserError, match="backend_strategies.gloo: unknown strategy 'dpp'"):
        plan(build_config(toml={"backend_strategies": {"gloo": ["dpp"]}}, flags={}, gpus=4), 4)


def test_workload_matrix_narrows_one_workload_and_keeps_its_reference(monkeypatch):
    """The default GPU matrix on 4 GPUs of 80 GiB with its model beyond one device (24 layers of
    gpt-20b's shape, 11.3B parameters): that model runs the strategies that cut it on NCCL x4 only;
    its reference and DDP are planned and skipped as out of memory; gpt-200m keeps the full matrix."""
    import bench.plan.matrix as matrix
    from bench.core.config import build_config
    from bench.core.errors import UserError

    monkeypatch.setattr(matrix, "device_memory", lambda device: 80 * 2**30)
    cfg = build_config(toml=None, flags={}, gpus=4, beyond="gpt-20b[n_layer=24]")
    cells, _, _ = plan(cfg, 4)
    big = {(p.spec.strategy, p.spec.backend, p.spec.n_devices): p.reason for p in cells
           if p.spec.workload.name == "gpt-20b(n_layer=24)"}
    assert set(big) == {("single", "nccl", 1), ("ddp", "nccl", 4), ("fsdp", "nccl", 4), ("tensor", "nccl", 4),
                        ("pipeline-1f1b", "nccl", 4)}
    assert big[("single", "nccl", 1)].startswith("out of memory before it starts: 11.3B parameters")
    assert big[("ddp", "nccl", 4)].startswith("out of memory before it starts")
    assert {k for k, r in big.items() if r is None} == {("fsdp", "nccl", 4), ("tensor", "nccl", 4),
                                                       ("pipeline-1f1b", "nccl", 4)}
    small = {(p.spec.strategy, p.spec.backend, p.spec.n_devices) for p in cells
             if p.spec.workload.name == "gpt-200m(global_batch=64)" and p.reason is None}
    assert {("ddp", "gloo", 2), ("ddp", "gloo", 4), ("tensor", "nccl", 2), ("fsdp-tp", "nccl", 4)} <= small
    def narrowed(strats, matrix, **toml):
        return plan(build_config(toml={"workloads": ["mlp"], "strategies": strats, "workload_matrix": {"mlp": matrix},
                                       **toml}, flags={}, gpus=0), 0)[0]

    with pytest.raises(UserError, match="unknown strategy 'fsdpp'; see `parbench list`"):
        narrowed(["all"], {"strategies": ["fsdpp"]})
    with pytest.raises(UserError, match="'fsdp' is not among the run's strategies; add it to the run's or drop it"):
        narrowed(["ddp"], {"strategies": ["fsdp"]})
    # One-process strategies follow the backends narrowing too; the reference is always planned.
    gpu = plan(build_config(toml={"workloads": ["mlp"], "strategies": ["ddp", "dataparallel"], "device": "cuda",
                                  "backends": ["nccl", "gloo"], "world_sizes": [1, 2],
                                  "workload_matrix": {"mlp": {"backends": ["gloo"]}}}, flags={}, gpus=2), 2)[0]
    got = {(p.spec.strategy, p.spec.backend, p.spec.n_devices): p.reason for p in gpu}
    assert set(got) == {("single", "nccl", 1), ("ddp", "gloo", 1), ("ddp", "gloo", 2)}
    assert got[("ddp", "gloo", 1)] is None  # its nccl twin is not in this workload's matrix: measured here
    # World sizes narrow the run's; under weak scaling the reference runs each narrowed batch.
    weak = narrowed(["ddp"], {"world_sizes": [2]}, world_sizes=[1, 2, 4], scaling="weak")
    assert sorted((p.spec.strategy, p.spec.n_devices, p.spec.workload.global_batch) for p in weak) == [
        ("ddp", 2, 128), ("single", 1, 128)]


def test_cells_whose_parameters_cannot_fit_are_skipped_as_out_of_memory(monkeypatch):
    """gpt-20b (20.3B parameters, 151.6 GiB of fp32 values and gradients) on 80 GiB GPUs: a whole copy
    per device cannot fit; cut in 4 it can (38 GiB a GPU before activations); cut in 2 (76 GiB) is
    not ruled out, since this is a lower bound."""
    import bench.plan.matrix as matrix
    from bench.decide.rules import capacity_from, is_oom

    monkeypatch.setattr(matrix, "device_memory", lambda device: 80 * 2**30)
    by, _, _ = planned({"workloads": "gpt-20b", "strategies": "ddp,dataparallel,fsdp,tensor,pipeline-1f1b",
                        "backends": "nccl", "world_sizes": "2,4", "training": {"optimizer": "sgd"}}, 4)
    for key in [("single", "nccl", 1), ("ddp", "nccl", 2), ("ddp", "nccl", 4), ("dataparallel", "nccl", 4)]:
        reason = by[key].reason
        assert reason.startswith("out of memory before it starts: 20.3B parameters, a whole copy on each device, "
                                 "need 151.6 GiB on one GPU"), (key, reason)
        assert is_oom(reason) and capacity_from(reason) == 80 * 2**30  # the recommendation reads it so
    for key in [("fsdp", "nccl", 2), ("fsdp", "nccl", 4), ("tensor", "nccl", 4), ("pipeline-1f1b", "nccl", 4)]:
        assert by[key].reason is None, (key, by[key].reason)
    # On a CPU host of 24 GiB even the cut model's parameters, all ranks together, cannot fit.
    monkeypatch.setattr(matrix, "device_memory", lambda device: 24 * 2**30)
    by, _, _ = planned({"workloads": "gpt-20b", "strategies": "fsdp", "world_sizes": "2", "device": "cpu",
                        "training": {"optimizer": "sgd"}}, 0)
    assert "151.6 GiB in this host's memory" in by[("fsdp", "gloo", 2)].reason
    assert by[("single", "gloo", 1)].reason.startswith("out of memory before it starts")
    # Small models are never touched, and an unknown memory skips nothing.
    by, _, _ = planned({"workloads": "gpt-tiny", "strategies": "fsdp", "world_sizes": "2", "device": "cpu"}, 0)
    assert by[("fsdp", "gloo", 2)].reason is None
    monkeypatch.setattr(matrix, "device_memory", lambda device: None)
    by, _, _ = planned({"workloads": "gpt-20b", "strategies": "ddp", "world_sizes": "2", "device": "cpu"}, 0)
    assert by[("ddp", "gloo", 2)].reason is None
