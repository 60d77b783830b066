"""MQKS ("Message Queue Kept Simple") text protocol over the hub core."""
