"""The simclock service."""
