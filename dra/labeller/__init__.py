"""`dra-gpu node-labeller`: GPU Feature Discovery's node labels, kept on the driver's own Node.

A program beside the kubelet plugin and the device plugin (it imports
neither): it advertises no device and takes no share of the GPUs, but labels
the node after all of them (dra.core.labels computes the labels). ``command``
starts ``daemon``; the device plugin's config it labels after comes in from dra.cli.

Rule: a program package: imports every layer below, never another program; ``command`` over
``daemon`` (a layer contract).
"""
