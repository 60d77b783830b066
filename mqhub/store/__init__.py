"""Durable message storage: the MemoryStore reference, the LMDB store, segment files and snapshots."""
