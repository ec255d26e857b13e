"""The ``planweave`` command line (Typer): ``run``, ``resume``, ``runs``, ``show``, ``cancel`` and ``bench``.

The app and the console entry point live in :mod:`planweave.cli.main`. This package imports nothing itself, so
``python -m planweave.cli.main`` runs that module exactly once.
"""
