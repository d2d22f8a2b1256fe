"""seeupo.integrations.verl_worker: what of SeeUPO's verl worker runs without GPUs and Ray.

Marked ``verl``. verl's engine workers need CUDA and Ray, so the worker's update itself does not run
here; what it calls does: the batch exactly as the worker receives it (verl's own ``to_tensordict``
and ``left_right_2_no_padding``) through :func:`tensordict_rows`, the update on it against the
core, and the configuration checks on verl's composed config (the recipe of ``configs/verl/``).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.verl

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "verl"

try:
    from verl.workers.utils.padding import left_right_2_no_padding

    from seeupo.integrations import verl_worker
    from seeupo.integrations.verl_sequential import sample_batch_from_verl, sequential_update
except ImportError:  # `make test` deselects this module; elsewhere each test skips with the reason
    verl_worker = None

sys.path.insert(0, str(Path(__file__).parent))
from test_verl_sequential import config, params, problem, tiny, verl_batch  # noqa: E402,F401 (tiny: a fixture)


@pytest.fixture(autouse=True)
def _needs_verl():
    if verl_worker is None:
        pytest.skip("verl's engine workers are not importable (make test-verl builds an environment with verl==0.9.1)")


def worker_batch(data):
    """What verl's trainer hands ``update_actor``: the DataProto as a TensorDict, padding removed."""
    return left_right_2_no_padding(data.to_tensordict())


def test_the_workers_batch_is_read_as_the_dataproto(tiny):
    eps, old, ref = problem(5, tiny)
    want, _ = sample_batch_from_verl(verl_batch(eps, old, ref))
    got, _ = sample_batch_from_verl(verl_worker.tensordict_rows(worker_batch(verl_batch(eps, old, ref))))
    for name in ("traj_id", "group_id", "turn", "logp_old", "token_mask", "valid", "reward", "traj_return"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert all(torch.equal(got.data[k], want.data[k]) for k in want.data)


def test_the_update_on_the_workers_batch_equals_the_one_on_the_dataproto(tiny):
    eps, old, ref = problem(6, tiny)
    cfg = config()
    a, b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    sequential_update(a, torch.optim.SGD(a.parameters(), lr=0.05), verl_batch(eps, old, ref), cfg, temperature=0.9)
    rows = verl_worker.tensordict_rows(worker_batch(verl_batch(eps, old, ref)))
    sequential_update(b, torch.optim.SGD(b.parameters(), lr=0.05), rows, cfg, temperature=0.9)
    assert (params(a) - params(tiny)).abs().max() > 1e-4
    assert (params(a) - params(b)).abs().max() < 1e-12


def test_a_batch_without_rewards_or_uids_names_what_is_missing(tiny):
    eps, old, ref = problem(7, tiny)
    data = verl_batch(eps, old, ref)
    data.pop(batch_keys=["token_level_rewards"])
    with pytest.raises(ValueError, match="the actor's batch lacks token_level_rewards: the SeeUPO worker needs them"):
        verl_worker.tensordict_rows(worker_batch(data))


def recipe(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(RECIPE), version_base=None):
        return OmegaConf.to_container(compose("seeupo_qwen3-14b_bfcl", overrides=list(overrides)), resolve=True)


def test_the_recipe_is_accepted_and_carries_the_papers_settings():
    cfg = recipe()
    assert verl_worker.verl_config_refusal(cfg) is None
    algo = verl_worker.algorithm_from(cfg["seeupo"]["algorithm"])
    actor, rollout = cfg["actor_rollout_ref"]["actor"], cfg["actor_rollout_ref"]["rollout"]
    assert (algo.name, algo.group_size, algo.kl_coef, algo.kl_estimator) == ("seeupo", 8, 0.002, "k3")
    assert (rollout["n"], rollout["temperature"], actor["optim"]["lr"], actor["kl_loss_coef"]) == (8, 0.9, 1e-6, 0.002)
    assert cfg["data"]["train_batch_size"] == 32 and actor["strategy"] == "fsdp2"


@pytest.mark.parametrize("override, says", [
    ("critic.enable=true", "verl runs a critic"),
    ("algorithm.adv_estimator=gae", "verl runs a critic"),
    ("+seeupo.algorithm.advantage=gae", "seeupo.algorithm: advantage='gae' needs a critic"),
    ("actor_rollout_ref.actor.strategy=fsdp", "strategy='fsdp': the SeeUPO worker needs 'fsdp2'"),
    ("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm", "has no seeupo aggregation"),
    ("actor_rollout_ref.actor.loss_agg_mode=token-mean", "contradicts seeupo.algorithm aggregation='seq_mean_token_mean'"),
    ("actor_rollout_ref.actor.kl_loss_coef=0.01", "contradict seeupo.algorithm kl_coef=0.002"),
    ("actor_rollout_ref.actor.kl_loss_type=kl", "kl_loss_type='kl' contradicts seeupo.algorithm kl_estimator='k3'"),
    ("actor_rollout_ref.actor.entropy_coeff=0.01", "entropy_coeff=0.01 contradicts seeupo.algorithm entropy_coef=0.0"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=16", "must equal data.train_batch_size=32"),
    ("actor_rollout_ref.rollout.multi_turn.enable=false", "multi_turn.enable is false"),
    ("seeupo.algorithm.preset=nope", "seeupo.algorithm.preset"),
    ("~seeupo", "no seeupo.algorithm section"),
])
def test_what_verl_cannot_carry_is_refused_in_one_line(override, says):
    reason = verl_worker.verl_config_refusal(recipe(override))
    assert reason is not None and says in reason and "\n" not in reason


def test_the_launcher_refuses_before_any_worker_starts(tmp_path):
    # hydra writes its run folder (outputs/DATE/TIME) into the working directory: keep it out of the repository
    out = subprocess.run([sys.executable, "-m", "seeupo.integrations.verl_worker", "--config-path", str(RECIPE),
                          "--config-name", "seeupo_qwen3-14b_bfcl", "critic.enable=true"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=os.environ | {"RAY_ADDRESS": ""})
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert errors == [line for line in out.stderr.splitlines() if "Traceback" not in line and line.startswith("error")]
    assert len(errors) == 1 and "verl runs a critic" in errors[0]
    assert "Traceback" not in out.stderr
    assert not (REPO / "outputs").exists()


class StandInEngine:
    """verl's FSDP engine as the worker uses it, around a module on the CPU (``rank`` of ``world``, the default group)."""

    def __init__(self, module, optimizer, rank: int = 0, world: int = 1):
        self.module, self.optimizer, self.rank, self.world, self.scheduler_steps = module, optimizer, rank, world, 0

    def get_data_parallel_group(self):
        return None

    def get_data_parallel_size(self):
        return self.world

    def get_data_parallel_rank(self):
        return self.rank

    def is_mp_src_rank_with_outputs(self):
        return self.rank == 0

    def train_mode(self, **kwargs):
        import contextlib

        return contextlib.nullcontext()

    def lr_scheduler_step(self):
        self.scheduler_steps += 1


def stand_in_worker(engine: StandInEngine, cfg):
    """A ``SeeUPOTrainingWorker`` around ``engine`` (verl's ``__init__`` would build a CUDA engine)."""
    from types import SimpleNamespace

    worker = object.__new__(verl_worker.SeeUPOTrainingWorker)
    worker.engine = engine
    worker.engine_config = SimpleNamespace(use_dynamic_bsz=False)
    worker.optimizer_config = SimpleNamespace(clip_grad=1.0)
    worker.algorithm = cfg
    return worker


def worker_input(data):
    """``data`` as verl's trainer hands it to ``update_actor``, with the rollout temperature."""
    from verl.utils import tensordict_utils as tu

    td = worker_batch(data)
    tu.assign_non_tensor(td, temperature=0.9)
    return td


def test_the_workers_train_mini_batch_runs_the_update_on_a_stand_in_engine(tiny):
    """The worker's own method (verl's dispatch decorator included), its engine replaced by a CPU stand-in."""
    eps, old, ref = problem(10, tiny)
    cfg = config()
    a, b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    sequential_update(a, torch.optim.SGD(a.parameters(), lr=0.05), verl_batch(eps, old, ref), cfg, temperature=0.9)
    worker = stand_in_worker(StandInEngine(b, torch.optim.SGD(b.parameters(), lr=0.05)), cfg)
    out = worker.train_mini_batch(worker_input(verl_batch(eps, old, ref)))
    assert (params(a) - params(tiny)).abs().max() > 1e-4
    assert (params(a) - params(b)).abs().max() < 1e-12
    assert worker.engine.scheduler_steps == 1
    from verl.utils import tensordict_utils as tu

    metrics = tu.get(out, "metrics")
    assert {"pg_loss", "kl_loss", "grad_norm", "fused_ratio_passes", "mfu"} <= set(metrics)
    assert metrics["fused_ratio_passes"] == [1.0] and metrics["optimizer_steps"] == [3.0]


def test_two_ranks_each_with_half_the_rows_make_the_single_process_update(tiny, tmp_path):
    """Two processes (gloo, FSDP2 over the tiny model), each given the rows verl's balance_batch
    partition hands its rank: the worker gathers the batch, forwards its own rows, and FSDP2 sums
    the gradients; the parameters equal one process's update on the whole batch."""
    eps, old, ref = problem(12, tiny)
    cfg = config()
    single = copy.deepcopy(tiny)
    sequential_update(single, torch.optim.SGD(single.parameters(), lr=0.05), verl_batch(eps, old, ref), cfg, temperature=0.9)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(Path(__file__).parent / "verl_dp_worker.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    result = torch.load(tmp_path / "params.pt")
    got = torch.cat([result[name].flatten() for name, _ in single.named_parameters()])
    assert (params(single) - params(tiny)).abs().max() > 1e-4
    assert (got - params(single)).abs().max() < 1e-10
    assert result["rows"] == [4, 4]  # each rank held half the rows


TRAINER_PROBE = """
import os, sys, types

class StandIn(types.ModuleType):  # transfer_queue: imported by verl's v1 trainer at module level, not installable here
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value

sys.modules["transfer_queue"] = StandIn("transfer_queue")
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.v1.trainer_base import get_trainer_cls
import seeupo.integrations.verl_worker as w

with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    config = compose("seeupo_qwen3-14b_bfcl")
trainer = object.__new__(get_trainer_cls(w.TRAINER_MODE))
trainer.config = config
trainer._init_resource_pool_mgr()
for role, actor in trainer.role_worker_mapping.items():
    print(role, actor.__ray_metadata__.modified_class.__mro__[1].__name__)
"""


def test_the_trainer_mode_puts_the_seeupo_worker_in_verls_actor_role():
    """``trainer.v1.trainer_mode: seeupo_sync`` is registered when the module is imported, and its
    resource setup maps verl's actor role to the SeeUPO worker (verl's v1 trainer imported with a
    stand-in for ``transfer_queue``; nothing of it runs)."""
    out = subprocess.run([sys.executable, "-c", TRAINER_PROBE, str(RECIPE)], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["actor_rollout_ref", "SeeUPOActorRolloutRefWorker"]
