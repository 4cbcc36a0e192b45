"""Experiments that train small models to test a paper's claim; run each from the repository root as
`python -m experiments.NAME`.

`lib.py` holds what they share (the members' settings, the encoder, its training loop and scoring);
every other module is a script that imports only that library and the project's packages.
"""
