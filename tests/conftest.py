"""Shared pytest fixtures for the mqhub test suite."""
