"""Plain data the rest of the driver passes around: devices, the node's inventory, prepared claims.

Rule: frozen dataclasses and their small derived properties only. Nothing here
does I/O or imports another part of dra, so every layer may use it.
"""
