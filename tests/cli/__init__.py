"""Tests of the ``planweave`` command line."""
