"""Intersection-based transfer planner. Pure metadata."""

from liver.planner.plan import Plan, TransferTask, best_placement, identity_placement, plan_transfer

__all__ = ["Plan", "TransferTask", "best_placement", "identity_placement", "plan_transfer"]
