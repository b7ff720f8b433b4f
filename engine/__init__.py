"""A simulated inference engine with batching, and the frontend-engine hop (see the README's
architecture section)."""
