"""Analytics over snapshots: Arrow decoding, the PySpark data source ``mqhub``, export, report.

Nothing here imports Twisted; numpy, pyarrow, pyspark and matplotlib are imported lazily by the
modules that need them (extras ``mqhub[export]`` and ``mqhub[spark]``).
"""
