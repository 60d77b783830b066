"""Test-only drop-in that fails to import: discovery must name this file and load the rest."""

raise RuntimeError("this drop-in is broken on purpose")
