"""The driver's decisions, as pure functions over plain data.

Slices built (``slices``, each device's entry by ``deviceentries``) and converged on
(``sliceplan``), opaque configuration (``config``), CDI spec rendering (``cdi``, the one
place a claim's CDI spec is built), the GPU split between DRA and the device plugin
(``assignment``), what a prepare or unprepare gives a claim (``plan``, from the
ResourceClaim's allocation it reads) and the programs of steps that carry it out (``prepare``,
whose runner runs every step, under ``recovery`` for the start-up repair; ``migdevices``,
``vfio`` and ``mpsdaemons``, each with its steps and their runner, over the GPU's steps
``gpusteps`` and the step vocabulary ``steps``: what a step is, a claim's own), GPU sharing
(``sharing``), what the API server accepts (``versions``), an unhealthy device's taint
(``taints``), node labels (``labels``), static MIG layouts (``migconfig`` parses and
places, ``miglayout`` applies them as a program of the GPU's steps) and per-claim usage
(``usage``).

Rule: no I/O of any kind (files, network, NVML, clocks, threads); API objects come
in as dicts, answers go out as data. Imports only ``dra.api`` and ``dra.model``;
inside (a layer contract), the start-up repair over prepare over the plan over the CDI specs
over the steps' users over the single decisions over the API's vocabulary and the GPU's steps,
the step vocabulary below those. Tests feed literal objects.
"""
