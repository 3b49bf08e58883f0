"""Fleet control: nodes, placement, the reconciler."""
