"""The validating admission webhook (`dra-gpu webhook`): bad opaque configs refused at admission.

``admission`` decides (pure: an AdmissionReview in, its response out) with the same decoding
as prepare (dra.api), so a claim it admits fails at prepare only for what needs the devices
(memory, MPS capability, per-device keys) or the other claims.
``server`` serves it over HTTPS (aiohttp, only there), with certificates reloaded when their files
change, and probes and metrics through dra.daemon; ``command`` starts it from the flags.

Rule: a program package: imports every layer below, never another program; ``command`` over
``server`` over ``admission`` (a layer contract), which does no I/O (its own contract); only
``server`` imports aiohttp.
"""
