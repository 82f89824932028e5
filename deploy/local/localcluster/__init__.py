"""The local cluster: real Kubernetes components built from the Go module proxy, on 127.0.0.1.

How users try the driver without Docker (`make cluster-up`, `make demo`) and
what the test suite runs against; on containerd, the node has a network namespace
of its own (nodenet) and runs the chart's image built here (driverimage, release).
Not part of the installed package; the Makefile and pytest put ``deploy/local`` on
the import path.
"""
