"""The driver's configuration API: the opaque parameters a DeviceClass or ResourceClaim gives it.

``opaque.decode`` turns parameters into typed, normalized configs of a served version
(``v1beta1``: NVIDIA's GpuConfig and MigDeviceConfig); ``v1beta1.validate`` checks one against
the devices it configures; ``fields`` is the strict decoder and the JSON Schema both derive
from the dataclasses; ``python -m dra.api.schema`` writes api/<version>/*.schema.json.

Pure: no I/O (the schema command aside, which only writes the files it is asked to). Imports
only dra.model.
"""
