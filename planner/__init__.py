"""slotplan: planner."""
