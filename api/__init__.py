"""slotplan: api."""
