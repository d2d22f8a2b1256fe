"""One process of the two-rank SeeUPO worker test (run by ``torch.distributed.run`` from test_verl_worker.py).

Each rank takes the rows verl's ``balance_batch`` partition would hand it, runs
``SeeUPOTrainingWorker.train_mini_batch`` on a stand-in engine around an FSDP2-sharded tiny Qwen3
(gloo), and rank 0 writes the full parameters for the test to compare with one process's update.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

from seeupo.llm.distributed import exit_skipping_teardown, full_state_dict, init_distributed, shard_model, shutdown
from seeupo.llm.models import norms_in_model_dtype, tiny_qwen3

sys.path.insert(0, str(Path(__file__).parent))
from test_verl_sequential import balance_order, config, problem, verl_batch  # noqa: E402
from test_verl_worker import StandInEngine, stand_in_worker, worker_input  # noqa: E402


def main(work: Path) -> None:
    env = init_distributed()
    rank, world = env.dp.rank, env.dp.world_size
    tiny = norms_in_model_dtype(tiny_qwen3(seed=0, dtype=torch.float64)[0])
    eps, old, ref = problem(12, tiny)
    data = verl_batch(eps, old, ref)
    order = balance_order(data, k=world)
    part = len(order) // world
    mine = data.select_idxs(order[rank * part: (rank + 1) * part])
    model = shard_model(copy.deepcopy(tiny), env)
    worker = stand_in_worker(StandInEngine(model, torch.optim.SGD(model.parameters(), lr=0.05), rank, world), config())
    worker.train_mini_batch(worker_input(mine))
    rows = [None] * world
    torch.distributed.all_gather_object(rows, len(mine))
    state = {k: v.detach().clone() for k, v in full_state_dict(model).items()}
    if rank == 0:
        torch.save(state | {"rows": rows}, work / "params.pt")
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_skipping_teardown(0)  # as `seeupo train` does; an exception in main exits non-zero before this line
