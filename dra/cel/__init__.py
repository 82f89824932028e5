"""A pure-Python CEL evaluator with Kubernetes DRA semantics."""

from dra.cel.quantity import Quantity, QuantityError
from dra.cel.semver import Semver, SemverError

__all__ = ["Quantity", "QuantityError", "Semver", "SemverError"]
