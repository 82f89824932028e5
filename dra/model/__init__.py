"""Plain data the rest of the driver passes around: devices, the node's inventory, prepared claims,
what a claim's allocation gives this driver (``allocation``, with ClaimError, a prepare's refusal),
the node as the programs of dra.core see it (``node``: its settings, its state, a claim the API
server answered with, and StepError, a step's failure).

Rule: frozen dataclasses and their small derived properties only, plus the value
types they are made of (``quantity``: Kubernetes resource quantities, exact, which
the CEL evaluator and the configuration API share). Nothing here
does I/O, and it imports nothing of dra, so every layer may use it. Inside (a layer
contract): ``node`` over ``migmode`` over ``migoffer`` over the rest, none of which imports
another.
"""
