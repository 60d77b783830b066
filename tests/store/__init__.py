"""Crash-recovery and snapshot tests of the durable store (real child processes)."""
