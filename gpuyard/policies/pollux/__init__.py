"""The goodput-aware family (Pollux, OSDI '21; Sia, SOSP '23) and the baselines of Pollux's
artifact (Optimus+Oracle, Tiresias+TunedJobs), over the goodput model of
`gpuyard.shared.goodput`."""

from .baselines import PolluxOptimus, PolluxTiresias, TiresiasTunedState, step_time
from .pollux import Pollux, PolluxParams, PolluxState
from .profiles import ProfilesParams, UsesProfiles

__all__ = [
    "Pollux", "PolluxOptimus", "PolluxParams", "PolluxState", "PolluxTiresias", "ProfilesParams", "TiresiasTunedState", "UsesProfiles",
    "step_time",
]  # fmt: skip
