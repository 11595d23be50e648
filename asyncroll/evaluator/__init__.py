"""Untrusted-code execution: the sandbox, LiveCodeBench's comparison and the ``lcb_evaluate`` tool.

Modules: :mod:`~.isolation` (which layers work here, probed once), :mod:`~.sandbox` (one program on one
input, whole tree killed after), :mod:`~.preexec` (its child's set-up before ``exec``),
:mod:`~.cgroups` (per-test memory/pids groups, cgroup v1),
:mod:`~.cgroups_v2` (the same on cgroup v2, for hosts without v1 memory/pids hierarchies),
:mod:`~.harness` (the code that runs inside the sandbox), :mod:`~.compare` (LiveCodeBench's
comparison), :mod:`~.lcb_json` (functional tests' JSON under LiveCodeBench's 50,000-digit int limit),
:mod:`~.cases` (test records, checked: workload validation runs the same checks),
:mod:`~.budget` (the time and memory limits' defaults, bounds and total budget, which ``asyncroll
run``'s flags are checked against) and :mod:`~.evaluate` (``lcb_evaluate``).
Nothing is imported here eagerly: a tool worker imports the evaluator only on its first
``lcb_evaluate`` call.
"""
