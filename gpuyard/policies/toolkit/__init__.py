"""Building blocks shared by the policy families (optimisation helpers over numpy arrays)."""
