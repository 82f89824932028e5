"""The driver's configuration API: the opaque parameters a DeviceClass or ResourceClaim gives it.

``opaque.decode`` turns parameters into typed, normalized configs of a served version
(``v1beta1``: NVIDIA's GpuConfig and MigDeviceConfig); ``v1beta1.validate`` checks one against
the devices it configures; ``fields`` is the strict decoder and the JSON Schema both derive
from the dataclasses; ``schema`` renders the schemas, which ``dra-gpu api-schema`` (``make
api``) writes to api/<version>/*.schema.json.

Rule: pure (no I/O); imports only ``dra.model``; inside, ``schema`` over ``opaque`` over
``v1beta1`` over ``fields`` (a layer contract).
"""
