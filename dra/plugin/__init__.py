"""The kubelet-facing gRPC side: plugin registration and the DRA services on unix sockets."""
