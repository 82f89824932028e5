"""Adapters to the outside world other than GPUs: the Kubernetes API and the node's files.

``kube`` is the only importer of the kubernetes client (its calls are coroutines, each
request made on a worker thread by ``kubeget``, its HTTP/1.1 transport and the only
importer of httptools), with ``kubeconfig`` reading the credentials it can; ``nodefiles``
is the node's own files: the atomic writes of every file the runtime or a restarted driver
reads (temp file, fsync, rename), the appends one fsync makes durable together, the
cross-process flocks, the named crash points the tests stop at, and the CDI directory;
``checkpoint`` owns the prepared-claim file and its format (NVIDIA's DRA driver's checkpoint,
found at its path, is ``nvidiacheckpoint``'s to recognise and keep aside),
``assignmentrecord`` the host's record of which path owns which GPU.

Rule: thin I/O around pure decisions; imports only ``dra.core`` (to render or validate what it
stores), ``dra.documents``, ``dra.api`` and ``dra.model``: never the GPUs, CEL or a daemon. Inside (a layer
contract): the stores and the API client over ``nvidiacheckpoint`` over ``kubeconfig`` and
``nodefiles`` over ``kubeget`` and ``tlsfiles``; only ``kube`` imports ``kubeget``.
"""
