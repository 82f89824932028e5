"""The driver's decisions, as pure functions over plain data.

Slices built (``slices``, each device's entry by ``deviceentries``) and converged on
(``sliceplan``), opaque configuration (``config``), CDI spec rendering (``cdi``, the one
place a claim's CDI spec is built), the GPU split between DRA and the device plugin
(``assignment``), what a prepare or unprepare gives a claim (``plan``, from the
ResourceClaim's allocation it reads) and the programs of steps that carry it out, each step a
call of the runner the program is given (``prepare``, whose ``NodeRunner`` runs every step of a
claim, under ``recovery`` for the start-up repair; ``migdevices``, ``vfio`` and ``mpsdaemons``,
each declaring the steps it calls, over the GPU's steps ``gpusteps``), GPU sharing
(``sharing``), what the API server accepts (``versions``), an unhealthy device's taint
(``taints``), node labels (``labels``), static MIG layouts (``migconfig`` parses and
places, ``miglayout`` applies them as a program of the GPU's steps) and per-claim usage
(``usage``).

Rule: no I/O of any kind (files, network, NVML, clocks, threads): a program's every effect is a
call of the runner it is given, whose protocol the program's module declares; API objects come
in as dicts, answers go out as data. Imports only ``dra.api`` and ``dra.model``;
inside (a layer contract), the start-up repair over prepare over the plan over the CDI specs
over the steps' users over the single decisions over the API's vocabulary and the GPU's steps,
over the steps several runners share (``runner``).
Tests feed literal objects, and a recording runner.
"""
