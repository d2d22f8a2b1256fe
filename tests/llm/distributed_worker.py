"""One process of the data-parallel equivalence test (run by ``torchrun`` from test_distributed.py).

For each preset: the update of the recorded global batch, made by this process on its half of
the groups (FSDP2, gloo); the full parameters written for the test to compare with the
single-process update; a checkpoint written by the processes together; and a second update
resumed from the *single-process* checkpoint, to compare with the single-process second update.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from seeupo.llm.config import load_train_config
from seeupo.llm.distributed import (exit_skipping_teardown, full_state_dict, gather_batch, init_distributed, shutdown,
                                   split_groups)
from seeupo.llm.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from test_distributed import warm_model  # noqa: E402


def main(work: Path) -> None:
    env = init_distributed()
    data = torch.load(work / "data.pt", weights_only=False)
    for preset, extra in data["presets"].items():
        cfg = load_train_config(None, data["overrides"] + extra + [f"algorithm.preset={preset}", f"out_dir={work / preset / 'dp'}"])
        local = [split_groups(batch, env.dp.world_size, env.dp.rank) for batch in data["batches"]]
        model, tokenizer = warm_model(data["weights"])
        trainer = Trainer(cfg, model=model, tokenizer=tokenizer, dist=env)
        metrics = trainer.update(gather_batch(local[0], env.dp))
        params = {k: v.detach().clone() for k, v in full_state_dict(trainer.model).items()}
        trainer.save()
        model, tokenizer = warm_model(data["weights"])
        resumed = Trainer(cfg.__class__.from_dict({**cfg.to_dict(), "out_dir": str(work / preset / "single")}),
                          model=model, tokenizer=tokenizer, dist=env)
        assert resumed.resume() == 1
        resumed.update(gather_batch(local[1], env.dp))
        second = {k: v.detach().clone() for k, v in full_state_dict(resumed.model).items()}
        if env.is_main:
            torch.save({"params": params, "metrics": metrics, "second": second}, work / preset / "dp_result.pt")
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_skipping_teardown(0)  # an exception in main exits non-zero before this line
