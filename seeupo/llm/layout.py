"""The token layout of a language-model :class:`~seeupo.core.batch.SampleBatch`, and how rows share prefixes.

``SampleBatch.data`` for language models, one row per (trajectory, turn)::

    input_ids       [n, C] long  context + response token ids, right-padded (pad value irrelevant)
    attention_mask  [n, C] long  1 on the row's real tokens (context and response), 0 on padding
    response_start  [n]    long  index in input_ids of the row's first response token

Response token ``j`` of row ``i`` is ``input_ids[i, response_start[i] + j]`` for
``j < token_mask[i].sum()``; the batch's ``token_mask`` / ``logp_old`` columns are response
positions. Its log-probability is read from the logits at position ``response_start[i] + j - 1``
(the prediction of the next token), so every valid row needs a non-empty context
(``response_start >= 1``). Placeholder rows (``valid=False``) are never run through the model:
their log-probabilities and values are exactly 0 and carry no gradient.

The agent loop builds it (:func:`pack_rows`), the policy, reference and critic of
:mod:`seeupo.llm.policy` score it, and :func:`packing_plan` finds the rows that are prefixes of
others (the turns of one trajectory), which a scoring pass forwards once.
"""

from __future__ import annotations

import torch

from seeupo.core.batch import SampleBatch

Tensor = torch.Tensor


def pack_rows(
    contexts: list[list[int]], responses: list[list[int]], pad_token_id: int = 0
) -> dict[str, Tensor]:
    """The ``data`` dict of the module docstring's layout from per-row token lists.

    A row with an empty context and an empty response is a placeholder: all padding,
    ``response_start = 0``.
    """
    if len(contexts) != len(responses):
        raise ValueError("contexts and responses must have one entry per row")
    n = len(contexts)
    width = max((len(c) + len(r) for c, r in zip(contexts, responses)), default=0)
    input_ids = torch.full((n, max(width, 1)), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, max(width, 1)), dtype=torch.long)
    response_start = torch.zeros(n, dtype=torch.long)
    for i, (ctx, resp) in enumerate(zip(contexts, responses)):
        ids = list(ctx) + list(resp)
        if ids:
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
        response_start[i] = len(ctx)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_start": response_start}


def scoring_batch(
    contexts: list[list[int]], responses: list[list[int]], pad_token_id: int = 0, dtype: torch.dtype = torch.float32
) -> SampleBatch:
    """A batch of independent rows to score (one trajectory each, turn 0, unit weight, no rewards).

    For teacher forcing outside the agent loop: every response given a context, e.g. every
    action of a finite action space (the bridge's exact ``J``) or supervised targets.
    """
    n = len(contexts)
    L = max((len(r) for r in responses), default=1)
    token_mask = torch.zeros(n, max(L, 1), dtype=torch.bool)
    for i, response in enumerate(responses):
        token_mask[i, : len(response)] = True
    return SampleBatch(
        traj_id=torch.arange(n), group_id=torch.arange(n), turn=torch.zeros(n, dtype=torch.long),
        logp_old=torch.zeros(token_mask.shape, dtype=dtype), token_mask=token_mask,
        valid=torch.tensor([len(r) > 0 for r in responses], dtype=torch.bool), reward=torch.zeros(n, dtype=dtype),
        traj_return=torch.zeros(n, dtype=dtype), weight=torch.ones(n, dtype=dtype), instance=torch.zeros(n, dtype=torch.long),
        data=pack_rows(contexts, responses, pad_token_id),
    )


def packing_plan(traj_id: Tensor, input_ids: Tensor, lengths: Tensor) -> Tensor:
    """``carrier [m]``: for each of ``m`` rows, the row whose forward pass gives its numbers.

    Rows are visited longest first within each trajectory (``traj_id``); a row whose first
    ``lengths[i]`` token ids equal the first ``lengths[i]`` ids of an earlier-visited carrier
    of its trajectory (the longest such carrier) is carried by it, any other row is a carrier
    (``carrier[i] == i``). Rows of different trajectories are never packed together, and a row
    is carried only when the ids say it is a prefix: nothing is assumed of the batch.

    Args:
      traj_id: ``[m]`` trajectory of each row.
      input_ids: ``[m, C]`` token ids, right-padded.
      lengths: ``[m]`` real tokens of each row (its attention mask's sum).
    """
    traj_id, input_ids, lengths = traj_id.cpu(), input_ids.cpu(), lengths.cpu()
    m = traj_id.numel()
    carrier = torch.arange(m)
    # by trajectory, then longest first (ties: the earlier row carries the later)
    by_length = torch.argsort(lengths, descending=True, stable=True)
    order = by_length[torch.argsort(traj_id[by_length], stable=True)]
    traj = traj_id.tolist()
    carriers: list[int] = []  # the current trajectory's carriers, longest first
    for k, i in enumerate(order.tolist()):
        if k == 0 or traj[i] != traj[int(order[k - 1])]:
            carriers = []
        n = int(lengths[i])
        match = next((c for c in carriers if torch.equal(input_ids[c, :n], input_ids[i, :n])), None)
        if match is None:
            carriers.append(i)
        else:
            carrier[i] = match
    return carrier


def shared_prefix_lengths(group_id: Tensor, input_ids: Tensor, lengths: Tensor, limit: Tensor) -> Tensor:
    """``prefix [m]``: how many first tokens each row shares with every row of its group, at most ``limit``.

    For each group (``group_id``): the longest common prefix of its rows' real tokens (checked on
    the ids, so nothing is assumed of the batch: rows whose prompts differ share only what is
    equal), cut to the smallest ``limit`` of the group; every row of a group gets the group's
    value. A group of one row shares its tokens up to its ``limit``.

    Args:
      group_id: ``[m]`` group of each row (a task's rollouts, which start from the same prompt).
      input_ids: ``[m, C]`` token ids, right-padded.
      lengths: ``[m]`` real tokens of each row.
      limit: ``[m]`` at most this many tokens of row ``i`` may be shared (for scoring: the
        position of its first logit that is read, so that every read position is after the prefix).
    """
    group_id, input_ids, lengths, limit = group_id.cpu(), input_ids.cpu(), lengths.cpu(), limit.cpu()
    prefix = torch.zeros(group_id.numel(), dtype=torch.long)
    for g in torch.unique(group_id).tolist():
        members = (group_id == g).nonzero().squeeze(1)
        cap = int(torch.minimum(lengths[members], limit[members]).min())
        ids = input_ids[members, :cap]
        differs = (ids != ids[:1]).any(0).nonzero()
        prefix[members] = int(differs[0]) if differs.numel() else cap
    return prefix
