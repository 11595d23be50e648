"""Simulation: the real runtime and policies on a virtual clock, against a model of the inference server."""
