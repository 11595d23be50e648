"""Paired experiments on one inference server: config, server lifecycle, staged arms, comparison, report.

``config`` (ExperimentConfig) → ``plan`` (the ordered arms and their exact commands) → ``runner`` (stages,
receipts, resume) using ``server`` (a fresh server per arm) and ``client`` (``asyncroll run`` as a
subprocess) → ``comparison`` (comparison.json) → ``stats`` and ``report`` (REPORT.md, aggregate.json,
the figure). ``fingerprint`` pins the protocol that every stage and resume must match.
"""
