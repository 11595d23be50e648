"""Model backends: where a trajectory's next action comes from."""
