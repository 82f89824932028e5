"""`dra-gpu explain`: why a claim does or does not get devices, offline.

``report`` is pure (claim, classes and slices in; a report out), on the CEL
evaluator ``dra.cel``, with ``devices`` (the slices' devices, held ones and
shared counters) and ``shapes`` (the fields it reads, checked first);
``command`` gathers its inputs from files, the cluster or fake GPUs.

Rule: a program package; imports every layer below, never another program. Inside (a
layer contract): ``command`` over ``report`` over ``devices`` and ``shapes``.
"""
