"""Names shared by the trainer, the tracker, export and the dashboards (platform.md section 4).

One name for one thing: these strings are MLflow tag, param and metric keys and the columns of
the exported run tables.
"""

TAG_PREFIX = "k3scale."
TAG_STUDY = "k3scale.study"
TAG_CELL = "k3scale.cell"
TAG_TRIAL = "k3scale.trial"
TAG_ARCH = "k3scale.arch"
TAG_SCHEDULE = "k3scale.schedule"
TAG_SIZE = "k3scale.size"
TAG_BUDGET_TOKENS = "k3scale.budget_tokens"
TAG_CONFIG_HASH = "k3scale.config_hash"
TAG_GIT_SHA = "k3scale.git_sha"
TAG_GIT_DIRTY = "k3scale.git_dirty"
TAG_DATA_FINGERPRINT = "k3scale.data_fingerprint"
TAG_STATUS = "k3scale.status"
TAG_TRUNK_RUN_ID = "k3scale.trunk_run_id"
TAG_FORK_STEP = "k3scale.fork_step"
# "<study folder>/<run id>" of the run a reused run was copied from (k3scale/sweep/reuse.py).
TAG_REUSED_FROM = "k3scale.reused_from"
TAG_BACKEND = "k3scale.backend"
TAG_ARM = "k3scale.arm"
TAG_VERSION_TORCH = "k3scale.version.torch"
TAG_VERSION_TRITON = "k3scale.version.triton"
TAG_VERSION_CUDA = "k3scale.version.cuda"
TAG_DEVICE = "k3scale.device"
TAG_VERSION_PYTHON = "k3scale.version.python"
TAG_HOSTNAME = "k3scale.hostname"
# Which path the run's CPU ops took ("fused" C++ kernels or "torch"), and the CPU capability
# torch reports ("AVX512", "AVX2", "DEFAULT", ...). Tags, not params: a trial retried on another
# node may take another path, and MLflow refuses a changed param value.
TAG_KERNEL_PATH = "k3scale.kernel_path"
TAG_CPU_CAPABILITY = "k3scale.cpu_capability"
# Set by a sweep's trial task: which attempt of the trial this is (1 = first; a retry after its
# node died or its process was killed counts up) and the Ray node that ran the latest attempt.
TAG_ATTEMPT = "k3scale.attempt"
TAG_RAY_NODE = "k3scale.ray_node"
# Added by the tracking helper: the replica's run id, so upload_replica can find (and complete)
# the MLflow run that holds a replica instead of creating a duplicate.
TAG_REPLICA_RUN_ID = "k3scale.replica_run_id"
# On the one run per study that holds its fit.json and dashboard (not a trial).
TAG_STUDY_SUMMARY = "k3scale.study_summary"

# MLflow's own tags (mlflow/utils/mlflow_tags.py, mlflow 3.17.2): a run's parent (the UI nests
# children under it), an experiment's or run's description, and a dataset input's role.
MLFLOW_PARENT_RUN_ID = "mlflow.parentRunId"
MLFLOW_NOTE = "mlflow.note.content"
# What an experiment is. MLflow 3.17's UI does not route on it (it reads the browser's
# `workflowType`, see k3scale/commands/ui.py); the tag is kept as correct metadata.
MLFLOW_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND_TRAINING = "custom_model_development"
# A runs-table view stored on the experiment: a URL with `viewStateShareKey=<key>` opens the
# runs list in it, and the UI's "Views" menu lists it (mlflow 3.17.2 UI bundle).
MLFLOW_SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
RUNS_VIEW_KEY = "k3scale"
MLFLOW_DATASET_CONTEXT = "mlflow.data.context"

STATUS_FINISHED = "finished"
STATUS_DIVERGED = "diverged"
STATUS_FAILED = "failed"
STATUSES = (STATUS_FINISHED, STATUS_DIVERGED, STATUS_FAILED)

# Per-step metrics (MLflow step = optimizer step).
METRIC_TRAIN_LOSS = "train/loss"
METRIC_VAL_ID_LOSS = "val/id_loss"
METRIC_VAL_OOD_LOSS = "val/ood_loss"
METRIC_LR = "lr"
METRIC_TOKENS = "tokens"
METRIC_FLOPS = "flops"
METRIC_TOKENS_PER_S = "perf/tokens_per_s"
METRIC_MFU = "perf/mfu"
FINAL_PREFIX = "final/"
# The schedule's peak LR, one point at step 0 (the runs list shows a metric's latest value, and
# `lr` ends at the schedule's floor).
METRIC_PEAK_LR = "peak_lr"

# Derived quantities logged as params next to the flattened config (dotted keys).
PARAM_N_TOTAL = "derived.n_total"
PARAM_N_ACTIVE = "derived.n_active"
PARAM_FLOPS_PER_TOKEN_6N = "derived.flops_per_token_6n"
PARAM_FLOPS_PER_TOKEN_ATTN = "derived.flops_per_token_attn"
PARAM_BATCH_TOKENS = "derived.batch_tokens"

# JSONL replica: one file per run, one JSON object per line, each with a "type" key.
REPLICA_FILE = "replica.jsonl"
REPLICA_TYPES = ("run", "params", "tags", "metrics", "status", "artifact", "input", "sync")
