"""Reliability suite: crash cycles, fuzzing, resource limits, a full disk, security defaults."""
