"""slotplan: solver."""
