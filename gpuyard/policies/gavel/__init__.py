"""Gavel's heterogeneity-aware allocation policies (Narayanan et al., OSDI 2020) on OR-Tools."""
