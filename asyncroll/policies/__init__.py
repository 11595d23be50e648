"""CPU dispatch policies: pure functions of a queue snapshot (no await, no clock reads)."""

from asyncroll.policies.base import Decision, JobView, Policy, Prediction, QueueSnapshot
from asyncroll.policies.registry import get_policy

__all__ = ["Decision", "JobView", "Policy", "Prediction", "QueueSnapshot", "get_policy"]
