"""Adapters to the outside world other than GPUs: the Kubernetes API and the node's files.

``kube`` is the only importer of the kubernetes client (its calls are coroutines, each
request made on a worker thread by ``kubeget``, its HTTP/1.1 transport and the only
importer of httptools), with ``kubeconfig`` reading the credentials it can; ``atomicfile``
writes every file the runtime or a restarted driver reads (temp file, fsync,
rename); ``filelock`` holds flocks; ``cdistore`` owns the CDI directory,
``checkpoint`` the prepared-claim file (its format is dra.core.checkpointformat),
``assignmentrecord`` the host's record of which path owns which GPU; ``faults``
marks the crash points the tests stop at.

Rule: thin I/O around pure decisions; imports only ``dra.core`` (to render or validate what it
stores), ``dra.documents``, ``dra.api`` and ``dra.model``: never the GPUs, CEL or a daemon. Inside (a layer
contract): the stores and the API client over ``kubeconfig`` and ``filelock`` over the
primitives (``kubeget``, ``tlsfiles``, ``atomicfile``) over ``faults``; only ``kube`` imports
``kubeget``.
"""
