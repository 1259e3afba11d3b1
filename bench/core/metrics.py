"""The metric registry: the only list of the cells table's columns.

Every column a cell row can carry is one :class:`Metric` here (the core) or in a strategy's
``metrics`` (its own, e.g. the pipeline bubble). A metric says what it is (unit, dtype), how the
ranks' values combine, which way is better, how to print it, where it is shown and whether
``compare`` looks at it. The row builder, the parquet schema, the terminal summary, the report's
table and ``compare`` all read this registry, so adding a metric is one entry plus the code that
computes it.

Strategy metrics live in the strategy's own namespace: a declared name that equals a core column is
refused when the strategy is loaded (not at run time in rank 0), and a value a strategy returns
without declaring it is kept under ``<strategy>.<key>`` in the ``extras`` column instead of
becoming a column that could shadow a core one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.core import knobs, settings
from bench.core.text import gap_text

#: A breakdown whose profiled step is further than this from the timed median describes another
#: step: the profile pass runs again (bench.train.profile), and one still that far is drawn with a
#: warning and never used to say why one cell beats another.
BREAKDOWN_GAP_MAX = 0.10

Dtype = Literal["string", "Int64", "float64", "boolean"]
OverRanks = Literal["max", "mean", "sum", "min", "rank0"]
Kind = Literal["key", "fact", "metric", "label"]


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One column of the cells table."""

    name: str
    dtype: Dtype
    unit: str = ""
    kind: Kind = "metric"  # key: identifies the cell; fact: planned; metric: measured; label: strategy setting
    over_ranks: OverRanks = "rank0"  # how the per-rank values of a strategy metric combine
    higher_is_better: bool | None = None
    compared: bool = False  # compare reports it
    header: str = ""  # short column header for tables ("" = the name)
    fmt: str | Callable[[Any], str] = ""  # format spec or function for display
    scale: float = 1.0  # display value = value * scale (seconds shown as ms, bytes as GiB)
    shown: frozenset[str] = field(default_factory=frozenset)  # "summary", "report"
    derived: bool = False  # computed when a run is read (parity, scaling), never stored
    doc: str = ""
    # For strategy metrics computed from the finished row (e.g. the bubble from busy time and the
    # median step): row -> value. Runs after the core columns are filled.
    derive: Callable[[Mapping[str, Any]], Any] | None = None

    @property
    def title(self) -> str:
        return self.header or self.name

    def show(self, value: Any) -> str:
        """The value as a table shows it ('' for missing)."""
        if value is None or (isinstance(value, float) and value != value):
            return ""
        try:
            import pandas as pd

            if pd.isna(value):
                return ""
        except (TypeError, ValueError):
            pass
        if callable(self.fmt):
            return self.fmt(value)
        if isinstance(value, bool) or self.dtype in ("string", "boolean"):
            return str(value)
        v = value * self.scale if self.scale != 1.0 else value
        if self.fmt:
            return format(v, self.fmt)
        if isinstance(v, float):
            return f"{v:.2f}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v)


S, R = frozenset({"summary", "report"}), frozenset({"report"})


def _ms(**kw) -> dict[str, Any]:
    return dict(dtype="float64", unit="s", scale=1e3, fmt=".2f", **kw)


def _frac(**kw) -> dict[str, Any]:
    return dict(dtype="float64", unit="fraction", fmt=".0%", **kw)


def _gib(name: str, doc: str, **kw) -> Metric:
    return Metric(name=name, dtype="float64", unit="B", scale=2**-30, fmt=".2f", over_ranks="max", doc=doc, **kw)


def _err(name: str, doc: str, **kw) -> Metric:
    return Metric(name=name, dtype="float64", unit="fraction", fmt="+.1%", doc=doc, **kw)


#: The memory columns: the memory model's prediction for the fullest device (bench.core.memory,
#: planned) and what the fullest rank measured and held.
MEMORY: tuple[Metric, ...] = (
    _gib("peak_reserved_bytes", "the caching allocator's reserved peak over the timed steps (CUDA)",
         header="reserved GiB"),
    _gib("nvml_process_bytes", "what NVML saw the process use after the timed steps: the reservation, the CUDA "
                               "context, NCCL's buffers (empty where NVML does not list the process)"),
    _gib("held_params_bytes", "bytes of parameters the rank holds, counted from its optimizer's tensors"),
    _gib("held_grads_bytes", "bytes of gradients the rank holds when its first optimizer step starts"),
    _gib("held_optimizer_bytes", "bytes of optimizer state the rank holds after its first step"),
    _gib("mem_pred_bytes", "predicted allocated peak of the fullest device (the memory model)", header="pred GiB",
         shown=R),
    _gib("mem_pred_reserved_bytes", "predicted reserved peak: allocated + the allocator's declared fragmentation"),
    _gib("mem_pred_process_bytes", "predicted process memory: reserved + CUDA context + NCCL's buffers"),
    _gib("mem_pred_params_bytes", "predicted parameter bytes on the fullest device"),
    _gib("mem_pred_grads_bytes", "predicted gradient bytes on the fullest device at the optimizer step"),
    _gib("mem_pred_optimizer_bytes", "predicted optimizer-state bytes on the fullest device"),
    _gib("mem_pred_activations_bytes", "predicted activation bytes at backward's peak (the probe's line at the "
                                       "cell's micro-batch; the gradients existing then included)"),
    _gib("mem_pred_buffers_bytes", "predicted bytes of the strategy's own buffers (buckets, gathered units)"),
    _gib("mem_pred_data_bytes", "the batches staged on the device before timing"),
    _gib("mem_pred_temporaries_bytes", "predicted bytes of the optimizer step's own intermediates"),
    Metric(name="mem_pred_micro_batch", dtype="Int64", doc="samples in one forward on the fullest device"),
    Metric(name="mem_pred_at", dtype="string", doc="which peak is the larger: backward or optimizer step"),
    Metric(name="mem_pred_how", dtype="string",
           doc="how the prediction was made: the strategy's terms declared or approximate, the activations measured "
               "(CUDA) or traced (CPU), or a lower bound (no activation probe)"),
    Metric(name="mem_batch_fits", dtype="Int64", header="fits b/dev",
           doc="the largest micro-batch per device predicted to fit, with the margin (0: none; empty: unknown)"),
    _gib("mem_capacity_bytes", "the bytes a rank has: one GPU, or the host's memory over the node's ranks"),
    _err("mem_pred_error", "predicted / measured allocated peak - 1", header="pred err", shown=R),
    _err("mem_pred_reserved_error", "predicted / measured reserved peak - 1"),
    _err("mem_pred_process_error", "predicted / NVML's process memory - 1"),
)

#: The core columns, in table order.
CORE: tuple[Metric, ...] = (
    Metric(name="run_id", dtype="string", kind="fact"),
    Metric(name="cell_id", dtype="Int64", kind="fact"),
    Metric(name="workload", dtype="string", kind="key", shown=S, doc="workload name with its dimensions"),
    Metric(name="strategy", dtype="string", kind="key", shown=S),
    Metric(name="backend", dtype="string", kind="key", shown=S, doc="process-group backend the cell ran under"),
    Metric(name="device", dtype="string", kind="key"),
    Metric(name="mode", dtype="string", kind="key",
           doc="train (a training step), serve (requests) or collective (a sweep point)"),
    Metric(name="world_size", dtype="Int64", kind="key", header="ws", shown=S, doc="devices the cell uses"),
    Metric(name="nproc", dtype="Int64", kind="fact", doc="processes the cell uses"),
    Metric(name="nnodes", dtype="Int64", kind="key", header="nodes",
           doc="nodes (torchrun agents, one per machine) the cell's processes ran in; 1 for one-process cells"),
    Metric(name="cross_node", dtype="boolean", header="x-node",
           doc="the cell's ranks ran in more than one node, so its communication crossed between nodes"),
    Metric(name="link", dtype="string", header="link", shown=R,
           doc="for a cell whose traffic crossed nodes: 'N nodes over IFACE', the network interface(s) it took "
               "(GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, else the route to the rendezvous host), with '; one host: "
               "NCCL's data takes its intra-host transport' when NCCL's nodes are one machine; empty otherwise"),
    Metric(name="hosts", dtype="string", kind="fact",
           doc="the cell's nodes in node order, each as host(address of its link)"),
    Metric(name="rank_placement", dtype="string", kind="fact",
           doc="JSON list, one object per rank: rank, node, host, addr, iface, local_rank, devices, threads"),
    Metric(name="status", dtype="string", kind="fact", shown=S),
    Metric(name="reason", dtype="string", kind="fact"),
    Metric(name="role", dtype="string", kind="fact",
           doc="reference (the single-device cell), independent (checks its own parity) or empty"),
    Metric(name="steps", dtype="Int64", kind="fact", doc=settings.column_doc("steps")),
    Metric(name="warmup", dtype="Int64", kind="fact", doc=settings.column_doc("warmup")),
    Metric(name="time_cap_s", dtype="float64", unit="s", kind="fact",
           doc="seconds of timed steps after which no more are added (a budgeted run's cap for this cell's "
               "process group, drawn again before each group from the time left; a cell skipped at the "
               "deadline shows the plan's)"),
    Metric(name="global_batch", dtype="Int64", kind="fact"),
    Metric(name="scaling", dtype="string", kind="key",
           doc="strong: the same global batch at every world size; weak: the same batch per device"),
    Metric(name="precision", dtype="string", kind="fact"),
    # the training knobs (bench.core.knobs), each declared there once: compare keeps cells of other
    # values apart and names the difference
    *(Metric(name=k.name, dtype="string", kind="label", shown=R, doc=k.metadata["doc"]) for k in knobs.KNOBS),
    Metric(name="lr", dtype="float64", kind="fact", doc="the learning rate (each optimizer's default unless --lr)"),
    Metric(name="precision_policy", dtype="string", kind="fact", header="policy", shown=R,
           doc="parameter, compute and gradient-reduction dtypes: 'fp32 params, bf16 autocast', 'bf16 params, "
               "fp32 reduce' (FSDP2's MixedPrecisionPolicy) or 'fp32'; speed-ups are read against a one-device "
               "cell of the same policy"),
    Metric(name="compile_s", dtype="float64", unit="s", header="compile s", fmt=".1f", shown=R,
           higher_is_better=False,
           doc="seconds the cell's first step took beyond a settled step: torch.compile's compilation (compile "
               "on; the first steps are untimed warm-up, never in the step times)"),
    Metric(name="compiled_graphs", dtype="Int64", doc="graphs torch.compile built for the cell on rank 0 (compile on; "
                                                      "a compiled cell that built none fails: it ran eager)"),
    Metric(name="graph_breaks", dtype="Int64", doc="torch.compile's graph breaks on rank 0 (compile on)"),
    Metric(name="step_time_median_s", **_ms(header="step ms", shown=S, higher_is_better=False, compared=True)),
    Metric(name="step_time_p95_s", **_ms(header="p95 ms", shown=R, higher_is_better=False)),
    Metric(name="step_time_mean_s", **_ms(header="mean ms", higher_is_better=False)),
    Metric(name="step_time_ci_low_s", **_ms(higher_is_better=False)),
    Metric(name="step_time_ci_high_s", **_ms(higher_is_better=False)),
    Metric(name="ci_basis", dtype="string", kind="fact",
           doc="what the interval of the median was bootstrapped from: repeats (>= 3) or steps, and how"),
    Metric(name="repeats", dtype="Int64", kind="fact", doc="times the cell was planned to be measured"),
    Metric(name="repeats_done", dtype="Int64", doc="times it was measured (a time budget can cut rounds)"),
    Metric(name="timed_steps_total", dtype="Int64", doc="timed steps over all repeats"),
    Metric(name="warmup_steps_done", dtype="Int64", doc="warm-up steps taken until the step time settled"),
    Metric(name="target_reached", dtype="boolean",
           doc="the median's interval reached the target width before the step or time cap"),
    Metric(name="step_time_cv", dtype="float64", unit="fraction", header="cv", fmt=".1%", shown=R,
           doc="coefficient of variation of the timed steps (all repeats)"),
    Metric(name="repeat_spread", dtype="float64", unit="fraction", header="spread", fmt=".1%", shown=R,
           doc="(max - min) / median of the per-repeat medians"),
    Metric(name="bimodality", dtype="float64", doc="Sarle's bimodality coefficient of the timed steps"),
    Metric(name="outlier_steps", dtype="Int64", doc="timed steps beyond 3 IQR from the quartiles"),
    Metric(name="slow_rank", dtype="Int64", doc="a rank whose own step times are 15% above the others'"),
    Metric(name="stable", dtype="boolean", header="stable", shown=S,
           doc="cv and repeat spread <= 5%, not bimodal, few outliers, no slow rank, host not contended"),
    Metric(name="noise", dtype="string", header="noise", shown=S, doc="why the cell is not stable"),
    Metric(name="throughput_samples_s", dtype="float64", unit="samples/s", header="samples/s", fmt=".1f",
           shown=S, higher_is_better=True, compared=True),
    Metric(name="scaling_efficiency", dtype="float64", header="scaling eff", fmt=".2f", shown=S,
           higher_is_better=True, derived=True,
           doc="throughput / (world size x throughput of the single-device cell of the same per-device batch "
               "(weak) or global batch (strong)); with weak scaling this equals t(1) / t(n)"),
    Metric(name="scaling_note", dtype="string", derived=True, header="scaling note", shown=S,
           doc="why the scaling efficiency is not to be read as a number (above 1.05, unstable reference)"),
    Metric(name="scaling_unphysical", dtype="boolean", derived=True,
           doc="the scaling efficiency is above 1.05 with nothing to explain it (noise or a slow reference): "
               "no decision rests on the cell"),
    Metric(name="mfu", dtype="float64", unit="fraction", header="MFU", fmt=".1%", shown=S, higher_is_better=True),
    Metric(name="peak_mem_bytes", dtype="float64", unit="B", header="peak GiB", scale=2**-30, fmt=".2f", shown=R,
           over_ranks="max", higher_is_better=False),
    *MEMORY,
    Metric(name="loss_final", dtype="float64"),
    Metric(name="parity_rel_err", dtype="float64", header="parity err", fmt=".1e", shown=R,
           doc="largest relative difference of the global loss from the reference's, over all steps; filled "
               "when the run is read, except for cells that check their own parity (an ensemble)"),
    Metric(name="parity_tol", dtype="float64", derived=True,
           doc="the tolerance parity_ok uses: parity_tol_set when given, else the larger of the precision's "
               "(fp32 1e-5, bf16 2e-2; 1e-3 in fp32 under Adam and AdamW) and ROUNDING_FACTOR times the "
               "reference's parity_rounding"),
    Metric(name="parity_rounding", dtype="float64",
           doc="on a one-device reference: the largest relative loss difference between its first steps and the "
               "same steps trained again from the same seed with each batch's samples in reverse order (the "
               "workload's own float rounding; empty for compiled references and batches without a sample "
               "dimension)"),
    Metric(name="parity_step", dtype="Int64", derived=True,
           doc="the step (counted from the first, warm-up included) of the largest loss difference from one device"),
    Metric(name="parity_tol_set", dtype="float64", kind="fact",
           doc="the parity tolerance given for the cell (--parity-tol, or its workload's parity_tol); empty: the "
               "default"),
    Metric(name="batch_norm", dtype="string", kind="fact",
           doc="the BatchNorm layers of the model (per-rank batch statistics under data parallelism: parity names "
               "them)"),
    Metric(name="parity_ok", dtype="boolean", header="parity ok", shown=R, derived=True),
    Metric(name="params", dtype="Int64", kind="fact"),
    Metric(name="flops_per_sample", dtype="float64", kind="fact"),
    Metric(name="gpu_name", dtype="string", kind="fact"),
    Metric(name="cell_wall_s", dtype="float64", unit="s"),
    Metric(name="overhead_s", dtype="float64", unit="s", doc="wall time of the cell minus timed and profiled steps"),
    Metric(name="profile_s", dtype="float64", unit="s",
           doc="time of the profiled steps; with profile_at 'end' the profile pass's, its rebuild included"),
    Metric(name="profile_at", dtype="string", kind="fact",
           doc="when the profiled steps ran: end (a pass after every timed step of the process group) or "
               "inline (after the cell's first timed repeat, in the processes that time later cells)"),
    Metric(name="profile_note", dtype="string",
           doc="why the cell has no breakdown although it was to be profiled (its pass failed or was cut)"),
    Metric(name="compute_time_s", **_ms(header="compute ms", over_ranks="mean")),
    Metric(name="comm_time_s", **_ms(header="comm ms", shown=R, over_ranks="mean")),
    Metric(name="exposed_comm_s", **_ms(header="exposed ms", shown=R, over_ranks="mean", higher_is_better=False)),
    Metric(name="overlap_frac", **_frac(header="overlap", shown=R, over_ranks="mean")),
    Metric(name="idle_frac", **_frac(header="idle", shown=R, over_ranks="mean")),
    Metric(name="comm_calls_per_step", dtype="float64", unit="calls", over_ranks="mean",
           doc="collective and point-to-point calls per step and rank (distribution check evidence)"),
    Metric(name="comm_bytes_per_step", dtype="float64", unit="B", header="comm MiB/step", scale=2**-20, fmt=".1f",
           shown=R, over_ranks="mean", doc="bytes through collectives and point-to-point per step and rank"),
    Metric(name="param_share", dtype="float64", unit="fraction", header="params/rank", fmt=".0%", shown=R,
           over_ranks="max", doc="parameters the fullest rank holds, as a fraction of the model's"),
    Metric(name="profiled_step_s", **_ms(header="profiled ms", over_ranks="mean",
                                         doc="a profiled step, marker to marker (compute + exposed comm + idle "
                                             "add up to it)")),
    Metric(name="unprofiled_step_s", **_ms(header="unprofiled ms", over_ranks="mean",
                                           doc="the profile pass's steps just before its profiled ones, without the "
                                               "profiler, timed as the timed steps are: far from the timed median, "
                                               "the pass was still settling, or the cell built again steps at "
                                               "another speed")),
    Metric(name="profile_passes", dtype="float64", unit="passes", header="profile passes", fmt=".0f", over_ranks="max",
           doc="timing passes the profile pass ran, over its builds: one more each time a pass's profiled step was "
               "further than BREAKDOWN_GAP_MAX from the timed median (the closest pass is the breakdown)"),
    Metric(name="profile_builds", dtype="float64", unit="builds", header="profile builds", fmt=".0f", over_ranks="max",
           doc="builds of the cell for its deferred profile pass: another (up to 3) when a build's unprofiled "
               "steps, or all its timing passes, were further than BREAKDOWN_GAP_MAX from the timed median"),
    Metric(name="breakdown_gap", dtype="float64", unit="fraction", fmt=gap_text,
           doc="the slowest rank's profiled step / timed median - 1: how far the breakdown's step is from the "
               "measured one"),
    Metric(name="timed_start_unix", dtype="float64", unit="s"),
    Metric(name="timed_end_unix", dtype="float64", unit="s"),
    Metric(name="energy_j", dtype="float64", unit="J", over_ranks="sum"),
    Metric(name="energy_per_sample_j", dtype="float64", unit="J", header="J/sample", fmt=".2f", shown=R,
           higher_is_better=False),
    Metric(name="samples_per_j", dtype="float64", unit="samples/J", higher_is_better=True),
    Metric(name="gpu_util_mean", dtype="float64", unit="%", header="GPU util %", fmt=".0f", shown=R),
    Metric(name="sm_active_mean", dtype="float64", unit="%"),
    Metric(name="tensor_active_mean", dtype="float64", unit="%"),
    Metric(name="power_mean_w", dtype="float64", unit="W"),
    Metric(name="sm_clock_mean_mhz", dtype="float64", unit="MHz", doc="SM clock over the timed steps (NVML samples)"),
    Metric(name="gpu_temp_mean_c", dtype="float64", unit="C", doc="GPU temperature over the timed steps"),
    Metric(name="host_other_cpu_cores", dtype="float64", unit="cores",
           doc="CPU cores busy outside the benchmark's processes during the timed steps"),
    Metric(name="host_load1", dtype="float64", doc="1-minute load average during the timed steps"),
    Metric(name="host_cpu_steal_cores", dtype="float64", unit="cores", doc="CPU stolen by the hypervisor"),
    Metric(name="gpu_throttled_frac", dtype="float64", unit="fraction",
           doc="share of samples with a thermal, hardware-slowdown or power-brake clock reason on the cell's GPUs"),
    Metric(name="gpu_power_capped_frac", dtype="float64", unit="fraction",
           doc="share of samples at the software power cap (normal for a fully loaded GPU; not contention)"),
    Metric(name="gpu_other_procs", dtype="float64", doc="most processes outside the benchmark seen on the cell's GPUs"),
    Metric(name="contended", dtype="string", header="contended", shown=R,
           doc="why the host or the cell's GPUs were contended while it was measured"),
    Metric(name="extras", dtype="string", kind="fact",
           doc="JSON of values a strategy returned without declaring them, as {'<strategy>.<key>': value}"),
)
CORE_NAMES: frozenset[str] = frozenset(m.name for m in CORE)
_BY_NAME = {m.name: m for m in CORE}


def core(name: str) -> Metric:
    return _BY_NAME[name]


def check_declared(owner: str, declared: Iterable[Metric]) -> None:
    """Refuse strategy metrics that collide with a core column or with each other."""
    seen: set[str] = set()
    for m in declared:
        if m.name in CORE_NAMES:
            raise ValueError(f"strategy {owner!r} declares metric {m.name!r}, a core column; rename it "
                             f"(e.g. {owner.split('-')[0]}_{m.name})")
        if m.name in seen:
            raise ValueError(f"strategy {owner!r} declares metric {m.name!r} twice")
        seen.add(m.name)


def registry(strategy_metrics: Iterable[Metric] = ()) -> list[Metric]:
    """Core columns then the strategies' declared ones (first declaration of a name wins: two
    strategies of one family share their columns)."""
    out = list(CORE)
    names = set(CORE_NAMES)
    for m in strategy_metrics:
        if m.name not in names:
            names.add(m.name)
            out.append(m)
    return out


def stored(metrics: Iterable[Metric]) -> list[Metric]:
    """The columns written to disk (derived columns are computed when a run is read)."""
    return [m for m in metrics if not m.derived]
