"""Tests of the eMQP codec, router and plugin service."""
