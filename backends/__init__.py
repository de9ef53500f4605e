"""slotplan: backends."""
