"""The environment every rank starts with unless the user's own environment sets the variable."""

#: Set in every rank unless the user's environment sets them (OMP_NUM_THREADS too, per launch: the
#: host's cores over its ranks). NCCL_NVLS_ENABLE=0: no NVLink multicast (it can take a shared host's
#: GPUs out of service). TORCH_NCCL_ASYNC_ERROR_HANDLING=1: a failed collective tears the rank down
#: instead of hanging it. TEARDOWN_CUPTI=1: Kineto detaches
#: CUPTI (cuptiFinalize) when a torch.profiler session ends. Without it the profiler's CUPTI
#: callbacks stay on for the life of the process (pytorch/pytorch#144455), and every cell measured
#: after a profiled one pays for them: on an H100 with torch 2.11, a launch-bound loop ran 1.95x
#: slower after one profiler session with CUDA activity (tools/baselines/profiler_aftereffect.py,
#: docs/RESULTS.md). With ``--profile-at inline`` the harness profiles each cell's first repeat in
#: the processes that then measure the group's later cells, so this default is what keeps those
#: cells honest.
RANK_ENV_DEFAULTS = {"TEARDOWN_CUPTI": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
