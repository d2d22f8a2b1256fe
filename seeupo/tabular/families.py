"""The agentic problem families by name: the settings of :func:`seeupo.tabular.problems.random_agentic_mdp`.

Kept apart from the problem generators (and from torch) so that the command line can offer the
names as choices without importing the engine.
"""

from __future__ import annotations

#: The agentic problem families (:func:`seeupo.tabular.problems.random_agentic_mdp`'s settings), named in verify cells,
#: searches and check reports. In each, action 0 of every turn but the last stops the episode, so
#: the agent chooses when to stop and turn counts vary within a group.
AGENTIC_FAMILIES: dict[str, dict[str, object]] = {
    # the agent decides when to stop; the reward comes when the episode ends
    "stop": dict(intermediate_rewards=False, observations=1),
    # ... and every turn that continues earns an intermediate reward
    "intermediate": dict(intermediate_rewards=True, observations=1),
    # ... and each call returns one of two tool results at random (stochastic observations)
    "tool": dict(intermediate_rewards=True, observations=2),
    # ... with actions of 2 tokens from a vocabulary of 2 (the stop action is the token sequence 0 0)
    "tokens": dict(intermediate_rewards=True, observations=1, tokens=(2, 2)),
}

#: What each family models, in words (reports and ``seeupo search --list``).
AGENTIC_FAMILY_TEXT: dict[str, str] = {
    "stop": "the agent chooses when to stop, reward at the end",
    "intermediate": "the agent chooses when to stop, intermediate rewards",
    "tool": "the agent chooses when to stop, intermediate rewards, stochastic tool results",
    "tokens": "the agent chooses when to stop, intermediate rewards, actions of 2 tokens",
}
