"""Differential privacy on what a client sends (``dp=signature|client``).

- :mod:`.mechanism` (client side): clip what leaves the client and add Gaussian noise.
- :mod:`.accountant` (server side): ε(δ) over the releases each client has made, with
  dp-accounting's RDP accountant, and the noise multiplier a target ε needs.
"""
