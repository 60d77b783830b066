"""Codec fuzzing: one target per codec, driven by Hypothesis, atheris or a bounded random loop."""
