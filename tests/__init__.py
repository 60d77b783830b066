"""mqhub tests."""
