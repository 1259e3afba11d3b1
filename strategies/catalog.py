"""What every built-in strategy declares, readable without torch.

A declaration is the part of a strategy that the planner, the results tables, the decision layer
and ``parbench list`` read: its name and summary, its options, the columns it adds to its rows,
what it distributes and how it takes the training knobs. The strategy classes (one file each,
``strategies/<name>.py``) take their declaration from here, so opening a results folder or
listing the strategies needs no torch. A user's own strategy declares the same fields as class
attributes of its :class:`strategies.base.Strategy` subclass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bench.core.metrics import Metric


@dataclass(frozen=True, kw_only=True)
class Option:
    """A strategy option (``--option NAME=VALUE``), validated by type before launch."""

    name: str
    type: type  # int, float, str or bool
    default: Any  # None: the strategy fills it in ``resolve_options`` (it depends on the cell)
    help: str
    minimum: float | None = None
    choices: tuple[Any, ...] | None = None
    #: values the knob search (bench.plan.search) tries besides the cell's own, one option at a time
    search: tuple[Any, ...] = ()

    def parse(self, value: Any) -> Any:
        """The value as this option's type; ValueError with a one-line reason otherwise."""
        v = _typed(self, value)
        if self.minimum is not None and v < self.minimum:
            raise ValueError(f"option {self.name}={v} must be >= {self.minimum:g}")
        if self.choices is not None and v not in self.choices:
            raise ValueError(f"option {self.name}={v!r} must be one of {', '.join(map(str, self.choices))}")
        return v


def _typed(opt: Option, value: Any) -> Any:
    tp = opt.type
    if tp is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"option {opt.name}={value!r} must be true or false")
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"option {opt.name}={value!r} must be an integer, e.g. {opt.name}=8")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"option {opt.name}={value!r} must be an integer, e.g. {opt.name}=8") from None
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"option {opt.name}={value!r} must be a number") from None
    return str(value)


_DTYPES = {int: "Int64", float: "float64", bool: "boolean", str: "string"}


def option_column(opt: Option) -> Metric:
    """The row column recording an option's value for a cell (compare keeps cells of different
    settings apart: it is a label)."""
    return Metric(name=f"option_{opt.name}", dtype=_DTYPES.get(opt.type, "string"), kind="label", doc=opt.help)


@dataclass(frozen=True, kw_only=True)
class Declaration:
    """What a strategy declares (the class attributes of :class:`strategies.base.Strategy`)."""

    name: str
    summary: str
    needs: str
    min_world: int = 1
    one_process: bool = False  # one process drives all the cell's devices
    role: str = ""  # "reference" (the one-device cell) or "independent" (checks its own parity)
    options: tuple[Option, ...] = ()
    labels: tuple[Metric, ...] = ()  # row columns set at plan time from the options
    metrics: tuple[Metric, ...] = ()  # row columns the strategy measures itself
    # What a cell on more than one device must show to count as distributed
    # (bench.results.rows.distribution_check): "comm" (communication bytes every step), "sharded"
    # (each rank holds about 1/n of the parameters), "split" (no rank holds the whole model),
    # "devices" (every planned GPU holds memory: one-process multi-GPU).
    distributes: tuple[str, ...] = ("comm",)
    # The model is cut into as many parts as devices (sharded, split by layers or tensors), never
    # held whole on one (min_share).
    cuts: bool = False
    # How torch.compile applies under ``--compile on``: the whole module, each inner block (before
    # sharding) or each pipeline stage; "" when the strategy cannot compile, ``no_compile`` saying why.
    compiles: str = "the whole module"
    no_compile: str = ""
    no_ac: str = ""  # why activation checkpointing does not apply ("" when it applies, per block)
    # What the decision layer reads. ``default_for``: the case in which this strategy is the one
    # PyTorch's documentation points a user to ("fits": the model fits one device, data parallel;
    # "sharded": it does not). ``param_dtype_column``: the label naming the dtype its parameters
    # compute in, where the strategy may cast them (a lead it has for that reason, not for how it
    # distributes). ``overlap_option``: the option that trades communication overlap.
    default_for: str = ""
    param_dtype_column: str = ""
    overlap_option: str = ""

    def columns(self) -> tuple[Metric, ...]:
        """Every column the strategy adds to its rows: its labels, one ``option_<name>`` column per
        declared option (the value the cell ran with, default or given) and its metrics."""
        return (*self.labels, *(option_column(o) for o in self.options), *self.metrics)


# -- options and columns several strategies share --------------------------------------------------

MESH = Metric(name="mesh", dtype="string", kind="label", header="mesh", shown=frozenset({"report"}),
              doc="the layout the cell ran: dp2xtp2, pp4, split2, ...")
MESH_OPTION = Option(name="mesh", type=str, default=None,
                     help="2D layout DPxMP for the hybrids, e.g. 2x2 (default: dp=2, the rest model parallel)")
#: Topology-aware placement of the 2D hybrids: which dimension's groups are made of neighbouring
#: ranks. torchrun gives each node (agent) a contiguous block of global ranks, so neighbouring ranks
#: share a node: model parallel, which talks every layer, belongs there; data parallel, which talks
#: once a step, can cross the slower link between nodes.
PLACEMENTS = ("mp-in-node", "dp-in-node")
PLACEMENT_OPTION = Option(name="placement", type=str, default="mp-in-node", choices=PLACEMENTS,
                          help="rank layout of a 2D hybrid: mp-in-node (default) keeps each model-parallel group "
                               "on neighbouring ranks, inside a node, and data parallel across nodes; dp-in-node "
                               "the reverse (model parallel crosses nodes)")
PLACEMENT = Metric(name="mesh_placement", dtype="string", kind="label", header="placement",
                   shown=frozenset({"report"}),
                   doc="which mesh dimensions of a 2D hybrid stay inside a node and which cross nodes")

# The search tries 100 MiB beside DDP's 25: fewer, larger all-reduces, which pay where the gradients
# are large and the interconnect is fast (torchtitan leaves DDP's default; DDP's notes name the size as
# the knob that trades overlap against the calls' fixed cost).
BUCKET_MB = Option(name="bucket_mb", type=float, default=25.0, minimum=0.001, search=(100.0,),
                   help="gradient bucket size in MiB (DDP, hand-written bucketed all-reduce, dp-pp)")
GRAD_VIEW = Option(name="ddp_grad_as_bucket_view", type=bool, default=False,
                   help="DDP gradient_as_bucket_view: gradients alias the all-reduce buckets (saves a copy and "
                        "memory)")
STATIC_GRAPH = Option(name="ddp_static_graph", type=bool, default=False,
                      help="DDP static_graph: the set of used parameters never changes (lets DDP skip checks)")

RESHARD = Metric(name="reshard_after_forward", dtype="boolean", kind="label",
                 doc="FSDP2 frees gathered parameters after forward (True) or keeps them for backward")
PARAM_DTYPE = Metric(name="fsdp_param_dtype", dtype="string", kind="label",
                     doc="dtype FSDP2 gathers and computes the parameters in (MixedPrecisionPolicy)")
UNITS_BUILT = Metric(name="fsdp_units_built", dtype="Int64", over_ranks="rank0",
                     doc="FSDP2 units fully_shard built besides the root (fsdp_units decides which pieces)")
FSDP_MP = Option(name="fsdp_mp", type=str, default="auto", choices=("auto", "off"),
                 help="FSDP2 mixed precision: auto = bf16 parameters, fp32 reduction when precision is bf16; "
                      "off = fp32 parameters under autocast")
UNITS = Option(name="fsdp_units", type=str, default="inner", choices=("inner", "all"),
               help="FSDP2 units: inner = one per inner block, first and last pieces (embedding, head) in the root "
                    "unit (as plain_fsdp); all = every piece its own unit (embedding resharded, as torchtitan)")
RESHARD_LAST = Option(name="fsdp_reshard_last", type=bool, default=False,
                      help="FSDP2: also reshard the last block after forward (torchtitan does not)")

# Default: the plan that was faster where it was measured. On 4x H100 (gpt-200m, bf16, eager, 3
# interleaved repeats; docs/evidence/defaults-new-vs-old-h100-x4.parquet) Megatron ran 190 ms/step
# [166, 196] and torchtitan's sequence-parallel plan 264 ms [256, 292], with 42% less memory (6.0 vs
# 10.3 GiB): sequence parallelism pays for its extra collectives with torch.compile (--compile on)
# and async TP, which this suite does not apply. Both stay one option away.
TP_PLAN = Option(name="tp_plan", type=str, default="megatron", choices=("megatron", "sp"),
                 help="tensor-parallel plan: megatron = column/row linears (faster in eager mode here), sp = "
                      "torchtitan's sequence parallel on the norms and loss parallel (less activation memory)")

BALANCE = Option(name="pp_balance", type=str, default="blocks", choices=("blocks", "time", "params"),
                 help="pipeline stage cut: time = equal measured forward+backward time per stage (each block "
                      "timed once on the device); blocks = equal numbers of blocks, the first (embedding) and last "
                      "(head) riding along with the first and last stage; params = equal parameter counts")
# The search tries 8 and 16 micro-batches beside the default (max(4, 2 x stages)): a smaller bubble
# against more per-micro-batch overhead, which on 4 H200s cost more than it saved on the 236M GPT at
# one or two sequences a micro-batch
MICRO_BATCHES = Option(name="micro_batches", type=int, default=None, minimum=1, search=(8, 16),
                       help="micro-batches per step for the pipelines (default max(4, 2 x stages))")


def _pair(row, num: str, den: str) -> tuple[float, float] | None:
    """The row's ``num`` and ``den`` where both are numbers and ``den`` is positive."""
    a, b = row.get(num), row.get(den)
    if a is None or b is None or a != a or b != b or b <= 0:
        return None
    return a, b


def _bubble_measured(row) -> float | None:
    """Idle fraction of the busiest rank: 1 - busy / median step."""
    pair = _pair(row, "stage_busy_s", "step_time_median_s")
    return None if pair is None else max(0.0, 1.0 - pair[0] / pair[1])


def _pipeline_gap(row) -> float | None:
    """Timed median over the step the stages' own times predict, minus 1."""
    pair = _pair(row, "step_time_median_s", "stage_model_step_s")
    return None if pair is None else pair[0] / pair[1] - 1


PIPELINE_LABELS = (
    Metric(name="schedule", dtype="string", kind="label", doc="pipeline schedule"),
    Metric(name="micro_batches", dtype="Int64", kind="label", doc="micro-batches per step"),
    MESH,
)
PIPELINE_METRICS = (
    Metric(name="stage_busy_s", dtype="float64", unit="s", over_ranks="max",
           doc="m x forward+backward of one micro-batch through a rank's stages, timed alone (busiest rank)"),
    Metric(name="stage_blocks", dtype="string", over_ranks="rank0", header="blocks/stage", shown=frozenset({"report"}),
           doc="blocks in each pipeline stage, first to last (embedding and head count as blocks)"),
    Metric(name="bubble_theory", dtype="float64", unit="fraction", fmt=".0%", over_ranks="rank0",
           header="bubble theory", shown=frozenset({"report"}),
           doc="(p-1)/(m+p-1); (p-1)/(v*m+p-1) interleaved"),
    Metric(name="bubble_measured", dtype="float64", unit="fraction", fmt=".0%", header="bubble",
           shown=frozenset({"report"}), higher_is_better=False, derive=_bubble_measured,
           doc="1 - stage_busy_s / median step time"),
    Metric(name="stage_model_step_s", dtype="float64", unit="s", over_ranks="rank0",
           doc="the step the schedule takes with these stages' busy times t_i (per micro-batch): "
               "sum(t_i) + (m-1) x max(t_i); one loop per rank only"),
    Metric(name="bubble_stages", dtype="float64", unit="fraction", fmt=".0%", over_ranks="rank0",
           header="bubble (stages)", shown=frozenset({"report"}),
           doc="the busiest rank's bubble with these stages: 1 - m x max(t_i) / stage_model_step_s"),
    Metric(name="pipeline_gap", dtype="float64", unit="fraction", fmt="+.0%", header="vs stages",
           shown=frozenset({"report"}), higher_is_better=False, derive=_pipeline_gap,
           doc="median step / stage_model_step_s - 1: time between stages the stage model leaves out"),
)

ENSEMBLE_METRICS = (
    Metric(name="aggregate_s", dtype="float64", unit="s", over_ranks="max", higher_is_better=False,
           doc="all_gather of the members' predictions on one held-out batch"),
    Metric(name="aggregate_bytes", dtype="float64", unit="B", over_ranks="max"),
    Metric(name="ensemble_loss", dtype="float64", over_ranks="rank0",
           doc="loss of the members' mean prediction on the held-out batch"),
)


# -- the built-in strategies, in the order `parbench list` shows them ------------------------------

SINGLE = Declaration(
    name="single",
    summary="one device, no communication: the parity and scaling reference",
    needs="world size 1; any device",
    one_process=True,
    role="reference",
    distributes=(),
)
DATA_PARALLEL = Declaration(
    name="dataparallel",
    summary="nn.DataParallel: one process, module replicated on each GPU every step",
    needs="CUDA; world size <= visible GPUs; runs in one process",
    one_process=True,
    distributes=("devices",),
    compiles="",
    no_compile="nn.DataParallel replicates the module every forward; torch.compile does not follow the replicas",
    # Its replicas are shallow copies made every forward: a block's checkpointed or compiled forward
    # would stay bound to the original module on the first GPU.
    no_ac="nn.DataParallel's per-forward replicas would call the original block's forward",
)
DDP = Declaration(
    name="ddp",
    summary="DistributedDataParallel: bucketed all-reduce overlapped with backward",
    needs="world size <= devices; global batch divisible by world size",
    options=(BUCKET_MB, GRAD_VIEW, STATIC_GRAPH),
    default_for="fits",
    overlap_option="bucket_mb",
)
DDP_ZERO1 = replace(
    DDP,
    name="ddp-zero1",
    summary="DDP with ZeroRedundancyOptimizer: optimizer state sharded over the ranks (ZeRO-1)",
    default_for="",
)
ALLREDUCE = Declaration(
    name="allreduce",
    summary="hand-written data parallel: one all-reduce per gradient after backward",
    needs="world size <= devices; global batch divisible by world size",
)
ALLREDUCE_BUCKETED = replace(
    ALLREDUCE,
    name="allreduce-bucketed",
    summary="hand-written data parallel: gradients flattened into bucket_mb buffers, then all-reduced",
    options=(BUCKET_MB,),
    overlap_option="bucket_mb",
)
FSDP = Declaration(
    name="fsdp",
    summary=("FSDP2 fully_shard per inner block and the root, parameters resharded after forward (ZeRO-3), "
             "bf16 mixed precision"),
    needs="world size <= devices; global batch divisible by world size",
    options=(FSDP_MP, UNITS, RESHARD_LAST),
    labels=(RESHARD, PARAM_DTYPE),
    metrics=(UNITS_BUILT,),
    distributes=("comm", "sharded"),
    cuts=True,
    compiles="each inner block, before fully_shard",
    default_for="sharded",
    param_dtype_column="fsdp_param_dtype",
)
FSDP_NORESHARD = replace(
    FSDP,
    name="fsdp-noreshard",
    summary=("FSDP2 fully_shard per inner block and the root, parameters kept gathered from forward to backward "
             "(ZeRO-2-like)"),
    default_for="",
)
LAYERSPLIT = Declaration(
    name="layersplit",
    summary="naive model parallel in one process: blocks placed on several GPUs, activations .to(next)",
    needs="CUDA; world size (GPUs used) <= visible GPUs and <= blocks; one process",
    one_process=True,
    labels=(MESH,),
    distributes=("devices",),
    cuts=True,
    compiles="each GPU's stage",
)
CHAIN = Declaration(
    name="chain",
    summary="hand-written model parallel over ranks: blocking send/recv of activations and gradients",
    needs="world size >= 2 and <= blocks; CUDA+NCCL, CUDA+Gloo (through host memory) or CPU+Gloo",
    min_world=2,
    labels=(MESH,),
    # activations and gradients cross ranks every step (see the pipelines)
    cuts=True,
    compiles="each rank's stage",
)
PIPELINE_GPIPE = Declaration(
    name="pipeline-gpipe",
    summary="pipeline (torch.distributed.pipelining), GPipe: all forwards, then all backwards",
    needs="NCCL on CUDA or Gloo on CPU; blocks >= stages; global batch divisible by micro_batches",
    min_world=2,
    options=(MICRO_BATCHES, BALANCE),
    labels=PIPELINE_LABELS,
    metrics=PIPELINE_METRICS,
    # A pipeline distributes work and activations, not necessarily parameters: a stage cut by
    # time can hold most of a model whose parameters sit in cheap layers (a conv net's classifier).
    # The evidence is the activations and gradients crossing stages every step (its default
    # distributes=("comm",)).
    compiles="each pipeline stage",
)
PIPELINE_1F1B = replace(
    PIPELINE_GPIPE,
    name="pipeline-1f1b",
    summary="pipeline (torch.distributed.pipelining), 1F1B: one forward, one backward in steady state",
)
PIPELINE_INTERLEAVED = replace(
    PIPELINE_GPIPE,
    name="pipeline-interleaved",
    summary="pipeline, interleaved 1F1B with 2 stages per rank (smaller bubble, more messages)",
    needs=PIPELINE_GPIPE.needs + "; micro_batches divisible by world size",
)
TENSOR = Declaration(
    name="tensor",
    summary="tensor parallel: the workload's plan (GPT: column-wise then row-wise linears in attention and MLP)",
    needs="a workload with a tensor-parallel plan; heads divisible by world size; world size <= devices",
    options=(TP_PLAN,),
    labels=(MESH,),
    distributes=("comm", "split"),
    cuts=True,
    compiles="each inner block, after the tensor-parallel plan",
)
DP_PP = Declaration(
    name="dp-pp",
    summary="2D: 1F1B pipeline along each mesh row, hand-written bucketed gradient all-reduce across rows",
    needs="world size >= 4 = dp x pp (option mesh, default dp=2); NCCL on CUDA or Gloo on CPU",
    min_world=4,
    options=(MICRO_BATCHES, BALANCE, MESH_OPTION, BUCKET_MB, PLACEMENT_OPTION),
    labels=(*PIPELINE_LABELS, PLACEMENT),
    metrics=PIPELINE_METRICS,
    compiles="each pipeline stage",
    overlap_option="bucket_mb",
)
FSDP_TP = Declaration(
    name="fsdp-tp",
    summary="2D: tensor parallel inside each mesh row, FSDP2 across rows (option mesh='DPxTP')",
    needs="world size >= 4 = dp x tp (default dp=2); GPT workload; heads divisible by tp",
    options=(MESH_OPTION, FSDP_MP, UNITS, TP_PLAN, PLACEMENT_OPTION),
    labels=(MESH, PARAM_DTYPE, PLACEMENT),
    metrics=(UNITS_BUILT,),
    distributes=("comm", "split"),
    cuts=True,
    compiles="each inner block, after the tensor-parallel plan, before fully_shard",
    param_dtype_column="fsdp_param_dtype",
)
ENSEMBLE = Declaration(
    name="ensemble",
    summary="independent models, one per rank, each on its own data; outputs all_gather-ed at the end",
    needs="world size <= devices; global batch divisible by world size",
    min_world=2,
    role="independent",
    metrics=ENSEMBLE_METRICS,
    # Independent models exchange nothing while training (the all_gather of predictions happens
    # once, after the timed steps, and is reported as aggregate_bytes).
    distributes=(),
)
ENCODER_HEAD = Declaration(
    name="encoder-head",
    summary="two collaborating models: encoder on rank 0 feeds its output to a head on rank 1 every step",
    needs="world size 2; a workload with at least 2 blocks",
    min_world=2,
    # The head may be a sliver of the model (one linear layer): the evidence is the activations and
    # gradients crossing between the two models every step, not the split of the parameters.
    labels=(MESH,),
    cuts=True,
    compiles="each rank's stage",
)

DECLARED: dict[str, Declaration] = {d.name: d for d in (
    SINGLE, DATA_PARALLEL, DDP, DDP_ZERO1, ALLREDUCE, ALLREDUCE_BUCKETED, FSDP, FSDP_NORESHARD, LAYERSPLIT, CHAIN,
    PIPELINE_GPIPE, PIPELINE_1F1B, PIPELINE_INTERLEAVED, TENSOR, DP_PP, FSDP_TP, ENSEMBLE, ENCODER_HEAD,
)}
