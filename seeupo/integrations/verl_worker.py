"""SeeUPO inside verl 0.9.1's trainer: the actor worker's update replaced by the toolkit's sequential sweep.

What runs where in a verl job launched with :func:`main` (``python -m seeupo.integrations.verl_worker``,
the recipe in ``configs/verl/``, ``docs/verl.md``):

* rollouts: verl's agent loop and inference engine (vLLM / SGLang), unchanged;
* old log-probs, the reference's log-probs, the reward: verl, unchanged (``balance_batch`` too);
* verl's advantage estimator runs, but its output is not read: the actor recomputes the
  advantages of ``seeupo.algorithm`` on the per-turn rows (:mod:`seeupo.integrations.verl_sequential`);
* the actor's update: :class:`SeeUPOTrainingWorker` replaces verl's mini-batch loop with
  :func:`~seeupo.integrations.verl_sequential.sequential_update`, the core's
  :func:`~seeupo.core.update.policy_update` on verl's FSDP2 module and optimizer. Every
  data-parallel rank gathers the whole batch (token ids and per-token floats, no activations),
  trains on its own rows, and the core's normalisers are the global batch's; FSDP2 then sums the
  gradients (its divide factor set to 1), so the update is the single-process one.

:func:`verl_config_refusal` checks a composed verl config before Ray or any worker starts: what
verl cannot carry is one line naming it (:func:`main` exits 2).

Not run here: verl's own engine and worker group (they need CUDA GPUs and Ray; verl's engine
refuses a CPU device) and the v1 trainer (it imports ``transfer_queue``). ``make test-verl`` runs,
on the CPU: the batch as the worker receives it (verl's own ``to_tensordict`` and
``left_right_2_no_padding``), :meth:`SeeUPOTrainingWorker.train_mini_batch` on a stand-in engine
(one process, and two gloo processes with FSDP2) against the core, the config checks on the
recipe composed with verl's config, and the launcher's refusal.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any, Mapping

import torch

try:
    from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
except ImportError:
    raise ImportError("seeupo.integrations.verl_worker needs verl, which is not installed: pip install 'verl==0.9.1'") from None

from seeupo.core.config import AlgorithmConfig
from seeupo.integrations.verl import LOSS_AGG_MODES
from seeupo.integrations.verl_sequential import REQUIRED_KEYS, sequential_refusal, sequential_update

TRAINER_MODE = "seeupo_sync"
"""``trainer.v1.trainer_mode`` of verl's synchronous trainer with :class:`SeeUPOActorRolloutRefWorker`."""

ALGORITHM_ENV = "SEEUPO_ALGORITHM"
"""The environment variable that carries the ``seeupo.algorithm`` section (JSON) from :func:`main` to the workers."""


def algorithm_from(section: Mapping[str, Any] | None) -> AlgorithmConfig:
    """The :class:`AlgorithmConfig` of a ``seeupo.algorithm`` section (``{"preset": ..., **fields}``, as in
    ``seeupo train``'s configs); an ``InputError`` naming a bad field."""
    from seeupo.llm.config import resolve_algorithm

    return resolve_algorithm(dict(section or {}))


def verl_config_refusal(config: Mapping[str, Any]) -> str | None:
    """Why the composed verl ``config`` cannot run SeeUPO's worker (one line), or ``None``.

    Refused: no ``seeupo.algorithm`` section or a bad one; an algorithm the actor cannot run
    (:func:`~seeupo.integrations.verl_sequential.sequential_refusal`: a critic, exact
    advantages); a critic in verl (``critic.enable`` or ``algorithm.adv_estimator: gae``); an
    actor strategy other than ``fsdp2`` (the exact data-parallel sum needs FSDP2's divide
    factor); verl's ``loss_agg_mode``, ``ppo_epochs``, ``use_kl_loss`` / ``kl_loss_coef`` /
    ``kl_loss_type``, ``entropy_coeff`` that contradict the algorithm (verl's keys would silently not apply);
    ``ppo_mini_batch_size`` smaller than the batch (the sweep's steps per turn come from the
    algorithm, one minibatch per turn in SeeUPO); a rollout without multi-turn (no turns to read).
    """
    seeupo = config.get("seeupo") or {}
    if "algorithm" not in seeupo:
        return "the config has no seeupo.algorithm section (e.g. seeupo: {algorithm: {preset: seeupo}})"
    try:
        cfg = algorithm_from(seeupo["algorithm"])
    except ValueError as err:
        return str(err).replace("config.algorithm", "seeupo.algorithm")
    reason = sequential_refusal(cfg)
    if reason is not None:
        return f"seeupo.algorithm: {reason}"
    actor = config["actor_rollout_ref"]["actor"]
    rollout = config["actor_rollout_ref"]["rollout"]
    if config.get("critic", {}).get("enable") or config["algorithm"]["adv_estimator"] == "gae":
        return ("verl runs a critic (critic.enable or algorithm.adv_estimator=gae); the SeeUPO worker trains "
                "none: set algorithm.adv_estimator=grpo (its output is not read) and critic.enable=false")
    if actor["strategy"] != "fsdp2":
        return f"actor_rollout_ref.actor.strategy={actor['strategy']!r}: the SeeUPO worker needs 'fsdp2'"
    agg = LOSS_AGG_MODES.get(actor["loss_agg_mode"], (None,))[0]
    if agg is None:
        return (f"actor_rollout_ref.actor.loss_agg_mode={actor['loss_agg_mode']!r} has no seeupo aggregation "
                f"(one of {', '.join(LOSS_AGG_MODES)})")
    if agg != cfg.aggregation:
        return (f"actor_rollout_ref.actor.loss_agg_mode={actor['loss_agg_mode']!r} contradicts "
                f"seeupo.algorithm aggregation={cfg.aggregation!r}")
    if int(actor["ppo_epochs"]) != cfg.epochs:
        return f"actor_rollout_ref.actor.ppo_epochs={actor['ppo_epochs']} contradicts seeupo.algorithm epochs={cfg.epochs}"
    use_kl = bool(actor["use_kl_loss"])
    if use_kl != (cfg.kl_coef > 0) or (use_kl and float(actor["kl_loss_coef"]) != cfg.kl_coef):
        return (f"actor_rollout_ref.actor.use_kl_loss={use_kl}, kl_loss_coef={actor['kl_loss_coef']} contradict "
                f"seeupo.algorithm kl_coef={cfg.kl_coef} (verl scores the reference only with use_kl_loss)")
    if use_kl and {"low_var_kl": "k3", "k3": "k3", "kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2"}.get(
            actor["kl_loss_type"]) != cfg.kl_estimator:
        return (f"actor_rollout_ref.actor.kl_loss_type={actor['kl_loss_type']!r} contradicts seeupo.algorithm "
                f"kl_estimator={cfg.kl_estimator!r}")
    if float(actor.get("entropy_coeff") or 0.0) != cfg.entropy_coef:
        return (f"actor_rollout_ref.actor.entropy_coeff={actor.get('entropy_coeff')} contradicts seeupo.algorithm "
                f"entropy_coef={cfg.entropy_coef} (the worker's loss is seeupo's)")
    batch = int(config["data"]["train_batch_size"])
    if int(actor["ppo_mini_batch_size"]) != batch:
        return (f"actor_rollout_ref.actor.ppo_mini_batch_size={actor['ppo_mini_batch_size']} must equal "
                f"data.train_batch_size={batch}: the sweep's steps come from seeupo.algorithm (minibatches={cfg.minibatches})")
    if not rollout.get("multi_turn", {}).get("enable"):
        return "actor_rollout_ref.rollout.multi_turn.enable is false: a sequential update needs turns"
    return None


class _Rows(SimpleNamespace):
    """A verl batch as :func:`sample_batch_from_verl` reads it: ``batch`` (tensors) and ``non_tensor_batch``."""


def tensordict_rows(data: Any) -> _Rows:
    """The batch the actor worker receives (verl's ``TensorDict``, after ``left_right_2_no_padding``) as
    ``sample_batch_from_verl`` reads it: the padded tensors by key, ``uid`` as a list. A missing key
    is a ``ValueError`` naming it."""
    keys = set(data.keys())
    missing = [k for k in (*REQUIRED_KEYS, "uid") if k not in keys]
    if missing:
        raise ValueError(f"the actor's batch lacks {', '.join(missing)}: the SeeUPO worker needs them passed to update_actor")
    tensors = {k: data[k] for k in (*REQUIRED_KEYS, "ref_log_prob") if k in keys}
    uid = tu.get(data, "uid")
    return _Rows(batch=tensors, non_tensor_batch={"uid": list(uid)})


def gather_rows(rows: _Rows, group: Any) -> tuple[_Rows, torch.Tensor]:
    """Every data-parallel rank's rows, in rank order, and ``[B]`` the rank that holds each (its owner).

    The ranks' widths may differ: prompts are left-padded and responses right-padded to the widest.
    """
    import torch.distributed as dist

    parts: list[Any] = [None] * dist.get_world_size(group)
    local = {"batch": {k: v.cpu() for k, v in rows.batch.items()}, "uid": rows.non_tensor_batch["uid"]}
    dist.all_gather_object(parts, local, group=group)
    prompt = max(p["batch"]["prompts"].shape[1] for p in parts)
    response = max(p["batch"]["responses"].shape[1] for p in parts)
    pad = torch.nn.functional.pad

    def widened(key: str, value: torch.Tensor, P: int) -> torch.Tensor:
        if key == "prompts":
            return pad(value, (prompt - P, 0))
        if key == "attention_mask":  # [prompt | response]
            return torch.cat([pad(value[:, :P], (prompt - P, 0)), pad(value[:, P:], (0, response - (value.shape[1] - P)))], 1)
        return pad(value, (0, response - value.shape[1]))

    batch = {key: torch.cat([widened(key, p["batch"][key], p["batch"]["prompts"].shape[1]) for p in parts])
             for key in local["batch"]}
    owner = torch.cat([torch.full((len(p["uid"]),), r, dtype=torch.long) for r, p in enumerate(parts)])
    return _Rows(batch=batch, non_tensor_batch={"uid": [u for p in parts for u in p["uid"]]}), owner


class SeeUPOTrainingWorker(TrainingWorker):
    """verl's actor ``TrainingWorker`` whose :meth:`train_mini_batch` is the toolkit's update (module docstring)."""

    algorithm: AlgorithmConfig | None = None

    # verl's own dispatch of this method (its v1 trainer hands a TransferQueue reference, materialised here)
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def train_mini_batch(self, data: Any) -> Any:
        """The update on the actor's batch ``data`` (this rank's rows; module docstring); returns verl's
        ``{"metrics": ...}`` TensorDict on the rank that reports, ``None`` elsewhere."""
        from seeupo.core.parallel import DataParallel

        cfg = self.algorithm if self.algorithm is not None else algorithm_from(json.loads(os.environ[ALGORITHM_ENV]))
        rows = tensordict_rows(data)
        group = self.engine.get_data_parallel_group()
        world = self.engine.get_data_parallel_size()
        dp = None
        if world > 1:
            rows, owner = gather_rows(rows, group)
            dp = DataParallel(self.engine.get_data_parallel_rank(), world, group)
            for module in self.engine.module.modules():  # the core's losses are global sums: no mean over ranks
                if hasattr(module, "set_gradient_divide_factor"):
                    module.set_gradient_divide_factor(1.0)
        temperature = float(tu.get(data, "temperature", default=1.0))
        with self.engine.train_mode(disable_auto_offload=bool(tu.get(data, "disable_auto_offload", default=False))):
            dynamic = bool(getattr(self.engine_config, "use_dynamic_bsz", False))
            _, metrics = sequential_update(
                self.engine.module, self.engine.optimizer, rows, cfg, temperature=temperature,
                micro_batch_tokens=getattr(self.engine_config, "max_token_len_per_gpu", None) if dynamic else None,
                max_grad_norm=self.optimizer_config.clip_grad, dp=dp, owner=owner if dp is not None else None)
            self.engine.lr_scheduler_step()  # once per update, as verl's own mini-batch loop
        if not self.engine.is_mp_src_rank_with_outputs():
            return None
        metrics = {k.removeprefix("actor/"): [v] for k, v in metrics.items()}
        metrics["mfu"] = [float("nan")]  # verl's trainer reads it (perf/mfu/actor); not measured here
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics}).cpu()


class SeeUPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/reference worker with :class:`SeeUPOTrainingWorker` as its actor."""

    actor_worker_cls = SeeUPOTrainingWorker


def register_trainer_mode() -> type:
    """Register verl's synchronous v1 trainer with :class:`SeeUPOActorRolloutRefWorker` as
    ``trainer.v1.trainer_mode: seeupo_sync`` (once); returns the class. verl's v1 trainer needs
    the ``transfer_queue`` package: without it, an ``ImportError`` saying so."""
    try:
        import ray
        from verl.trainer.ppo.utils import Role
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
        from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    except ImportError as err:
        raise ImportError(f"verl's v1 trainer does not import ({err}); it needs verl's full install "
                          "(transfer_queue among others)") from None
    if TRAINER_MODE in TRAINER_REGISTRY:
        return TRAINER_REGISTRY[TRAINER_MODE]

    class SeeUPOTrainerSync(PPOTrainerSync):
        """verl's synchronous trainer with the SeeUPO actor worker."""

        def _init_resource_pool_mgr(self) -> None:
            super()._init_resource_pool_mgr()
            for role in (Role.ActorRolloutRef, Role.ActorRollout, Role.Actor):
                if role in self.role_worker_mapping:
                    self.role_worker_mapping[role] = ray.remote(SeeUPOActorRolloutRefWorker)

    return register_trainer(TRAINER_MODE)(SeeUPOTrainerSync)


def main() -> None:
    """verl's ``main_ppo`` with SeeUPO's worker: the config is checked first (:func:`verl_config_refusal`),
    the algorithm handed to the workers (``SEEUPO_ALGORITHM``), this module imported in every process
    (``VERL_USE_EXTERNAL_MODULES``), ``trainer.v1.trainer_mode`` set to ``seeupo_sync``."""
    import hydra
    import verl.trainer.config
    from omegaconf import OmegaConf, open_dict

    verl_configs = os.path.dirname(os.path.abspath(verl.trainer.config.__file__))

    @hydra.main(config_path=verl_configs, config_name="ppo_trainer", version_base=None)
    def run(config: Any) -> None:
        plain = OmegaConf.to_container(config, resolve=True)
        reason = verl_config_refusal(plain)
        if reason is not None:
            print(f"error: {reason}", file=sys.stderr)
            raise SystemExit(2)
        os.environ[ALGORITHM_ENV] = json.dumps(plain["seeupo"]["algorithm"])
        modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join([*modules, __name__])
        with open_dict(config):
            config.trainer.use_v1 = True
            config.trainer.v1.trainer_mode = TRAINER_MODE
        try:
            register_trainer_mode()
        except ImportError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        from verl.trainer.main_ppo import main as verl_main

        verl_main(config)  # a hydra main called with a config runs on it

    run()


try:  # imported in every verl process (VERL_USE_EXTERNAL_MODULES): the trainer mode exists where verl's v1 trainer does
    register_trainer_mode()
except ImportError:
    pass

if __name__ == "__main__":
    main()
