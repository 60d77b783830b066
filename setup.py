"""The one build step setup.cfg cannot declare: the optional C loop of the NATS frame scanner
(mqhub/protocols/nats/_scan.c). ``optional=True``: without a C compiler the install goes on
and mqhub uses the pure-Python scanner (scan.py), which gives the same results."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mqhub.protocols.nats._scan", ["mqhub/protocols/nats/_scan.c"],
                             optional=True)])
