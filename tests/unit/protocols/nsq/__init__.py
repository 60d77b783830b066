"""Tests of the NSQ protocol plugin (codec and server)."""
