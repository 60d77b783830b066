"""MQKS protocol unit tests."""
