"""Episodes: how one prompt becomes what the policy is trained on, whatever rollout source asks for it. A kind of
episode ([`EpisodeKind`], chosen by [`episode_kind`]) is one turn on the trainer's sampler, TRL's `tools=` loop
([`ToolLoop`]: turns and tool calls, tokens in and tokens out, advanced by a budget of policy tokens so a generation
window may cut an episode and the next one resume it), an `environment_factory`'s environments ([`Environments`]),
or a user's `rollout_func`; each episode's state between generation calls ([`ToolEpisode`]); and a
code-interpreter tool that runs model-written code in a child process with limits ([`python_tool`]).
"""

from .environments import Environments
from .kinds import (
    EpisodeKind,
    RolloutFunctionEpisodes,
    SampledBatch,
    SingleTurn,
    ToolLoopEpisodes,
    episode_kind,
)
from .rollout_function import function_rollouts, sample_with_rollout_function
from .sandbox import python_tool, run_python
from .tool_episode import ToolEpisode, episode_counts, episodes_output
from .tool_loop import (
    ToolEpisodes,
    ToolLoop,
    ToolSettings,
    episode_metrics,
    flag_on_any_process,
    sampler_turns,
    tool_name,
)

__all__ = [
    "Environments",
    "EpisodeKind",
    "RolloutFunctionEpisodes",
    "SampledBatch",
    "SingleTurn",
    "ToolEpisode",
    "ToolEpisodes",
    "ToolLoop",
    "ToolLoopEpisodes",
    "ToolSettings",
    "episode_counts",
    "episode_kind",
    "episode_metrics",
    "episodes_output",
    "flag_on_any_process",
    "function_rollouts",
    "python_tool",
    "run_python",
    "sample_with_rollout_function",
    "sampler_turns",
    "tool_name",
]
