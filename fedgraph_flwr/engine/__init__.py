"""The strategy engine: the only part of the library that touches Flower records."""
